#!/usr/bin/env bash
# 8 x 32000-token prompts decoding together through pyqsa serve, the prefix cache on (default)
# and off (--prefix-cache-gib 0), 2 runs each, then decode.py's 8 x 32128 step rate (3 runs)
set -u
export PYTHONPATH=/tmp/pyqsa-site CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1
model=$(ls .build/bench/flash-next-synth-*.gguf | head -n 1)
for cfg in on off; do
    extra=()
    [ $cfg = off ] && extra=(--prefix-cache-gib 0)
    pyqsa serve "$model" --port 8766 --slots 8 --ctx 36000 --batch-tokens 512 "${extra[@]}" > /tmp/serve-$cfg.log 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:8766/health > /dev/null && break; sleep 1; done
    echo "serve ($cfg) up at $SECONDS s"
    python3 -m pyqsa.bench.serve_load http://127.0.0.1:8766 --requests 8 --prompt-tokens 32000 \
        --max-tokens 256 --repeats 2 > "$OUT/load-$cfg.jsonl" 2>&1
    kill $pid; wait $pid
    echo "prefix cache $cfg ($SECONDS s):"; tail -n 1 "$OUT/load-$cfg.jsonl"
done
python3 -m pyqsa.bench.decode "$model" --variant pyqsa --seqs 8 --contexts 32128 --steps 32 --warmup 4 \
    --sampling device --repeats 3 --out "$OUT/decode-ratio.jsonl" > /dev/null 2> /tmp/decode-ratio.log ||
    tail -n 20 /tmp/decode-ratio.log
python3 -c "import json,sys; [print(r['n_seq'], r['context'], round(r['step_ms_median'],3), round(r['tok_s'],1)) for r in map(json.loads, open(sys.argv[1])) if r.get('kind')=='decode']" "$OUT/decode-ratio.jsonl"
echo "done ($SECONDS s)"
