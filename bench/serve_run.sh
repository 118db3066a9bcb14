#!/usr/bin/env bash
# GPU machine, after bench/gpu_run.sh built pyqsa and wrote the synthetic model: the server
# benchmark through HTTP, on `pyqsa serve MODEL --slots 8 --ctx 36000 --batch-tokens 512` (more
# serve flags may follow on the command line, e.g. --sampling host; the default, auto, draws on
# the device of a GPU build):
#   1. idle time to first token, 32-token prompt (bench/serve_ttft.py, 30 runs after 3 warm-up);
#   2. 8 x 32000-token prompts, 256 tokens each: the decode rate while all 8 decode together
#      (compare with bench/decode.py's 8-sequence step rate at 32K: target >= 0.95x);
#   3. 7 x 32000-token prompts and a 64-token request 2 s later: its time to first token
#      (target <= 0.5 s).
# Scenarios 2 and 3 run --repeats times (default 3; medians and spread in the summary lines);
# --prompt-tokens N changes 32000 (the context stays N + 4000).
#   device run: carry [".gpu-carry"], command: bench/gpu_run.sh ... ; bench/serve_run.sh [--repeats N]
#               [--prompt-tokens N] [serve flags]
#   elsewhere:  PYQSA_BENCH_MODEL=model.gguf bench/serve_run.sh ...
# Results: $OUT/serve-bench.jsonl (one summary line per scenario, with the serve flags and commit).
set -uo pipefail
cd "$(dirname "$0")/.."
repeats=3 prompt=32000
while [ $# -gt 1 ]; do
    case "$1" in
        --repeats) repeats=$2 ;;
        --prompt-tokens) prompt=$2 ;;
        *) break ;;
    esac
    shift 2
done
out=${OUT:-/tmp/pyqsa-bench-out}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/pyqsa-site} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
model=${PYQSA_BENCH_MODEL:-$(ls .build/bench/flash-next-synth-*.gguf | head -n 1)}
flags=(--slots 8 --ctx $((prompt + 4000)) --batch-tokens 512 "$@")
url=http://127.0.0.1:8766
log=/tmp/pyqsa-serve-bench.log  # its tail is shown on a failure
pyqsa serve "$model" --port 8766 "${flags[@]}" > "$log" 2>&1 &
pid=$!
for _ in $(seq 300); do
    curl -sf $url/health > /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 1
done
curl -sf $url/health > /dev/null || { echo "serve did not start:"; tail -n 30 "$log"; exit 1; }
head -n 5 "$log"
# where tokens are drawn, from the start line (--sampling auto picks device on a GPU)
sampling=$(sed -n 's/^pyqsa: sampling: \([a-z]*\).*/\1/p' "$log" | head -n 1)
meta="\"commit\": \"${PYQSA_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}\", \"serve_flags\": \"${flags[*]}\", \"sampling\": \"$sampling\""
status=0
record() {  # scenario name, command...: runs it, keeps its last line (the summary) with the metadata
    local name=$1; shift
    echo "== $name: $*"
    "$@" | tee /tmp/pyqsa-serve-bench-$name.txt || status=1
    tail -n 1 /tmp/pyqsa-serve-bench-$name.txt |
        python3 -c "import json,sys; print(json.dumps({'scenario': '$name', $meta, **json.load(sys.stdin)}))" \
            >> "$out/serve-bench.jsonl" || status=1
}
record idle_ttft python3 bench/serve_ttft.py $url --prompt-tokens 32 --runs 30 --warmup 3
record decode_together python3 bench/serve_load.py $url --requests 8 --prompt-tokens "$prompt" \
    --max-tokens 256 --repeats "$repeats"
record short_behind_long python3 bench/serve_load.py $url --requests 7 --prompt-tokens "$prompt" \
    --max-tokens 32 --short-after 2 --short-prompt-tokens 64 --repeats "$repeats"
curl -s $url/metrics | grep -E "^pyqsa_engine_step" || true
# the together rate over decode.py's 8-sequence rate at 32K from the same call (gpu_run.sh's
# decode runs, unpaged: the median of its runs with host sampling, and of its `sampled` runs,
# which draw on the device as the server does by default, where the call ran them), the target
# >= 0.95x
python3 - "$out" <<'PY' || true
import json, statistics, sys
from pathlib import Path

def lines(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l] if path.exists() else []

out = Path(sys.argv[1])
runs = [r for r in lines(out / "decode.jsonl") if r.get("kind") == "decode" and r.get("n_seq") == 8
        and r.get("context") == 32768]
refs = {sampling: [r["tok_s"] for r in runs if r.get("variant") == variant]
        for variant, sampling in (("pyqsa", "host"), ("pyqsa-sampled", "device"))}
if not any(refs.values()):
    sys.exit("no decode.py record at 32K x 8 in this call: compare decode_together by hand")
for s in lines(out / "serve-bench.jsonl"):
    if s["scenario"] == "decode_together" and "together_tok_s" in s:
        for sampling, ref in refs.items():
            if ref:
                rate = statistics.median(ref)
                print(f"decode_together ({s['serve_flags']}, sampling {s.get('sampling')}): "
                      f"{s['together_tok_s']} tok/s = {s['together_tok_s'] / rate:.3f}x decode.py's "
                      f"{rate:.1f} (32K x 8, {sampling} sampling, median of {len(ref)} runs)")
PY
kill $pid; wait $pid 2> /dev/null
[ $status = 0 ] || tail -n 30 "$log"
echo "serve benchmark: $([ $status = 0 ] && echo done || echo FAILED)"
exit $status
