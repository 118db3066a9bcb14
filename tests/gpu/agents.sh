#!/usr/bin/env bash
# GPU machine, after bench/gpu_run.sh built pyqsa and wrote the synthetic full-shape model: the
# prefix cache's agent scenario through `pyqsa serve`, paged on a 24 GiB device budget with the
# cache on: 4 agents, each a 200,000-token history then 5 follow-ups of 500 new tokens, 32-token
# replies (bench/agents.py; time to first token per turn, cached tokens, the cache's host bytes,
# device memory before and after); then one more agent alone, on that server and on a paged
# server without the cache, every reply's tokens and logprobs compared. The record:
# bench/results/<date>-<commit>-prefix.json and a copy in $OUT.
#   tests/gpu/agents.sh [--small] [--locality] [--trace] [--commit SHA] [--wait S] [--runs N] [stop]
# One command: it waits at most --wait seconds (default 540), the servers and the load outliving
# it (setsid); exit status 75 means still running: run the same command again (0 done, else a
# failure). `stop` stops what it started. --runs N: N runs, each on servers started afresh (state
# run1..runN), then one record of them all (bench/agents.py combine). --commit names the commit the record carries
# (PYQSA_BENCH_COMMIT). AGENTS_ARGS replaces bench/agents.py's sizes, AGENTS_CHECK_TOKENS the
# lone agent's history, AGENTS_CACHE_GIB the cache's budget (default 40), AGENTS_BUDGET the
# device budget's flags (default --gpu-memory 24). --small: 4 x 20,000-token histories, the same
# model and flags; on a machine without nvidia-smi (the CPU check) the embedded demo model, 2
# agents of 1,500 tokens, small slots. --locality: the model of `bench/gpu_run.sh --locality` (an
# indexer that prefers stable blocks, as trained models do). --trace: the cached server's engine
# steps timestamped (bench/ttft_trace.py), and where each follow-up's time to first token went
# written to $OUT/ttft-trace[-runN].txt. State: .build/agents[-small][-locality]/
# ($AGENTS_STATE names another).
set -uo pipefail
cd "$(dirname "$0")/../.."
small= locality= trace= wait_s=540 phase=run runs=
while [ $# -gt 0 ]; do
    case "$1" in
        --small) small=1 ;;
        --locality) locality=1 ;;
        --trace) trace=1 ;;
        --wait) wait_s=$2; shift ;;
        --runs) runs=$2; shift ;;
        --commit) export PYQSA_BENCH_COMMIT=$2; shift ;;
        stop) phase=stop ;;
        *) echo "agents.sh: unknown argument $1" >&2; sed -n '2,20p' "$0"; exit 2 ;;
    esac
    shift
done
[ -z "$runs" ] || [[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "agents.sh: --runs takes a count of 1 or more, not '$runs'" >&2; exit 2; }
t_end=$(( $(date +%s) + wait_s ))
state=${AGENTS_STATE:-.build/agents${small:+-small}${locality:+-locality}}
mkdir -p "$state"
out=${OUT:-$state/out}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/pyqsa-site} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# the command that continues the work (a run of --runs N is told its caller's, which names N)
rerun=${AGENTS_RERUN:-"tests/gpu/agents.sh ${small:+--small }${locality:+--locality }${trace:+--trace }${PYQSA_BENCH_COMMIT:+--commit $PYQSA_BENCH_COMMIT}"}
. tests/gpu/serve_lib.sh

if command -v nvidia-smi > /dev/null; then
    kind=${locality:+locality-}  # the default model's name has no kind; the others are left out
    model=$(ls .build/bench/flash-next-synth-"$kind"????????????.gguf 2> /dev/null | head -n 1)
    [ -n "$model" ] || { echo "agents.sh: no .build/bench/flash-next-synth-$kind*.gguf: run bench/gpu_run.sh ${locality:+--locality }first" >&2; exit 2; }
    read -r -a budget <<< "${AGENTS_BUDGET---gpu-memory 24}"
    common=("$model" --ctx 204800 --batch-tokens 512 --prefill-batch-tokens 2048 --kv-offload host
        ${budget[@]+"${budget[@]}"})
    warm=("${common[@]}" --slots 4 --prefix-cache-gib "${AGENTS_CACHE_GIB:-40}")
    cold=("${common[@]}" --slots 1 --prefix-cache-gib 0)
    sizes="--agents 4 --history-tokens 200000 --turns 5 --turn-tokens 500 --max-tokens 32"
    check=200000
    if [ -n "$small" ]; then
        sizes="--agents 4 --history-tokens 20000 --turns 5 --turn-tokens 500 --max-tokens 32"
        check=20000
    fi
    results=(--results bench/results)
else  # the CPU check: the embedded demo model
    [ -n "$small" ] || { echo "agents.sh: no nvidia-smi: only --small runs here (the demo model)" >&2; exit 2; }
    common=(--ctx 2048 --batch-tokens 64 --prefill-batch-tokens 256 --threads 1 --sampling host
        --kv-offload host --hot-blocks 8)
    warm=("${common[@]}" --slots 2 --prefix-cache-gib 0.25)
    cold=("${common[@]}" --slots 1 --prefix-cache-gib 0)
    sizes="--agents 2 --history-tokens 1500 --shared-tokens 300 --turns 2 --turn-tokens 60 --max-tokens 8"
    check=900
fi
[ -z "$small" ] || results=()  # a --small record stays out of bench/results
read -r -a sizes <<< "${AGENTS_ARGS:-$sizes}"

stop() {
    alive "$state/agents-job.pid" && kill -- "-$(cat "$state/agents-job.pid")" && echo "stopped the agents"
    stop_server warm
    stop_server cold
}

if [ -n "$runs" ]; then  # each run by this script on its own state, then their record
    self=("$0" ${small:+--small} ${locality:+--locality} ${trace:+--trace})
    records=()
    for i in $(seq 1 "$runs"); do
        left=$(( t_end - $(date +%s) ))
        if [ "$phase" = stop ]; then
            AGENTS_STATE=$state/run$i "${self[@]}" stop
            continue
        fi
        [ "$left" -gt 0 ] || { echo "still running; run \`${rerun% } --runs $runs\` again"; exit 75; }
        AGENTS_RERUN="${rerun% } --runs $runs" AGENTS_STATE=$state/run$i "${self[@]}" --wait "$left" || exit $?
        records+=("$state/run$i/agents.json")
    done
    [ "$phase" = stop ] && exit 0
    "$py" bench/agents.py combine "${records[@]}" ${results[@]+"${results[@]}"} --out "$out/agents-runs.json"
    exit $?
fi
if [ "$phase" = stop ]; then stop; exit 0; fi
if [ -f "$state/agents.json" ]; then
    echo "agents.sh: done before; its record is $state/agents.json (rm -r $state to run again)"
    exit 0
fi
# both launched first: their starts overlap; the cold one is idle until the lone agent
trace_out=${trace:+$(cd "$state" && pwd)/trace.json}
TRACE_OUT=$trace_out launch_server warm "${warm[@]}"
launch_server cold "${cold[@]}"
TRACE_OUT=$trace_out start_server warm "${warm[@]}"
start_server cold "${cold[@]}"
job agents-job "$state/agents.json" "$py" bench/agents.py "$(url_of warm)" "${sizes[@]}" \
    --check-url "$(url_of cold)" --check-history-tokens "${AGENTS_CHECK_TOKENS:-$check}" \
    --smi "$state/warm-smi.csv" ${results[@]+"${results[@]}"} --out "$state/agents.json"
cp "$state/agents.json" "$out/"
"$py" - "$state/agents.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
keys = ("first_turn_ttft_s", "follow_up_ttft_s", "follow_up_ttft_s_max", "ttft_s_by_turn",
        "follow_up_cached_share", "host_bytes_held")
print(json.dumps({k: r[k] for k in keys}))
print("check:", json.dumps(r["check"]))
print("device back to baseline:", json.dumps(r["device"]["back_to_baseline"]))
PY
stop
if [ -n "$trace" ]; then
    report=$out/ttft-trace${AGENTS_STATE:+-$(basename "$state")}.txt
    "$py" bench/ttft_trace.py report "$trace_out" "$check" | tee "$report"
fi
