#!/usr/bin/env bash
# GPU machine, after bench/gpu_run.sh built pyqsa and wrote the synthetic model: `pyqsa serve
# --slots 8 --ctx 262144 --kv-offload host` answers 8 concurrent requests of 2000 prompt tokens
# and 64 generated ones (bench/serve_load.py); more serve flags may follow on the command line.
#   device run: carry [".gpu-carry"], command: bench/gpu_run.sh ... ; tests/gpu/serve_paged.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pyqsa-gpu-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/pyqsa-site CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
model=$(ls .build/bench/flash-next-synth-*.gguf | head -n 1)
log=/tmp/pyqsa-serve-paged.log  # its tail is shown on a failure
pyqsa serve "$model" --slots 8 --ctx 262144 --kv-offload host --port 8765 "$@" > "$log" 2>&1 &
pid=$!
for _ in $(seq 180); do
    curl -sf http://127.0.0.1:8765/health > /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 1
done
grep -E "^pyqsa: (memory|paging)" "$log"
python3 bench/serve_load.py http://127.0.0.1:8765 --requests 8 --prompt-tokens 2000 --max-tokens 64 | tee "$out/serve_load.json"
status=${PIPESTATUS[0]}
curl -s http://127.0.0.1:8765/metrics | grep -E "^pyqsa_(paging|ledger)"
kill $pid; wait $pid 2> /dev/null
# serve_load.py prints a line per run, then the summary
answered=$(tail -n 1 "$out/serve_load.json" | python3 -c "import json,sys; print(json.load(sys.stdin)['answered'])" 2> /dev/null || echo 0)
ok=$([ $status = 0 ] && [ "$answered" = 8 ] && echo PASS || echo FAIL)
[ "$ok" = PASS ] || tail -n 30 "$log"
echo "serve --slots 8 --ctx 262144, paged: $answered of 8 requests answered: $ok"
[ "$ok" = PASS ]
