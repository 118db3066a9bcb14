#!/usr/bin/env bash
# GPU machine, after bench/gpu_run.sh built pyqsa and wrote the synthetic full-shape model: the
# mission load, eight ~255K-token completions at once through `pyqsa serve` on a 24 GiB device
# budget with the K/V paged, then the same load on the unpaged server and bench/decode.py's paged
# step at the same shape (bench/mission.py measures; this script runs the servers and the phases).
#   tests/gpu/mission.sh [--small] [--locality] [--commit SHA] PHASE [--wait S]
# --locality: the model of `bench/gpu_run.sh --locality` (an indexer that prefers stable blocks),
# state in .build/mission-locality/.
# --commit names the commit the records carry (PYQSA_BENCH_COMMIT: the device machine's git
# folder is not the tree sent); give it to every phase.
# Phases, in order; each fits one device call (--wait S, default 540: the seconds it waits at
# most); a server, a load and decode.py outlive the call that started them (setsid), and the
# next call's phase waits for them or collects their results. State: .build/mission/.
#   start-paged     serve --kv-offload host plus $MISSION_BUDGET's flags (default --gpu-memory 24),
#                   and nvidia-smi every second;
#                   returns once it listens and its baseline (ledger, nvidia-smi) is taken
#   load-paged      8 x 255,000-token prompts, 256 tokens each, then a prompt cancelled during
#                   its prefill and one during its decode, then the figures against the baseline
#   start-unpaged   stops the paged server; serve --kv-offload none (no device budget)
#   load-unpaged    the same load, no cancellations
#   decode-py       stops the servers; bench/decode.py paged at 8 x 262144, the paged server's
#                   hot blocks and step size
#   report          bench/results/<date>-<commit>-mission.json, and a copy in $OUT
#   stop            stops what this script started and still runs
#   all             every phase in turn without a wait limit (the CPU check, tests/e2e)
# Exit status: 0 done, 75 still running (run the same phase again), else a failure.
# --small: 8 x 2000-token prompts, 32 tokens each, cancellations of 16000-token prompts,
# decode.py at 8 x 16384, same model and serve flags; on a machine without nvidia-smi (the CPU
# check) the embedded demo model, small slots. Its state is .build/mission-small/
# ($MISSION_STATE names another folder). Servers listen on free ports (their URLs in the state).
set -uo pipefail
cd "$(dirname "$0")/../.."
small= locality= wait_s=540 phase=
while [ $# -gt 0 ]; do
    case "$1" in
        --small) small=1 ;;
        --locality) locality=1 ;;
        --wait) wait_s=$2; shift ;;
        --commit) export PYQSA_BENCH_COMMIT=$2; shift ;;
        -*) echo "mission.sh: unknown option $1" >&2; exit 2 ;;
        *) phase=$1 ;;
    esac
    shift
done
[ -n "$phase" ] || { sed -n '2,30p' "$0"; exit 2; }
t_end=$(( $(date +%s) + wait_s ))
state=${MISSION_STATE:-.build/mission${small:+-small}${locality:+-locality}}
mkdir -p "$state"
out=${OUT:-$state/out}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/pyqsa-site} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

common=(--slots 8 --batch-tokens 512 --prefill-batch-tokens 2048)
if command -v nvidia-smi > /dev/null; then
    kind=${locality:+locality-}  # the default model's name has no kind; the others are left out
    model=$(ls .build/bench/flash-next-synth-"$kind"????????????.gguf 2> /dev/null | head -n 1)
    [ -n "$model" ] || { echo "mission.sh: no .build/bench/flash-next-synth-$kind*.gguf: run bench/gpu_run.sh ${locality:+--locality }first" >&2; exit 2; }
    # the prefix cache off on both: its snapshots (a host copy of every prompt's K/V, and a
    # head every 16K prompt tokens) are not what this load measures
    common=("$model" "${common[@]}" --ctx 262144 --prefix-cache-gib 0)
    # the paged server's device budget (a consumer card's memory), from MISSION_BUDGET
    read -r -a budget <<< "${MISSION_BUDGET---gpu-memory 24}"
    paged=("${common[@]}" --kv-offload host ${budget[@]+"${budget[@]}"})
    unpaged=("${common[@]}" --kv-offload none)
    decode_model=$model decode_ctx=262144 decode_extra=(--ubatch 2048)
    load_args=(--requests 8 --prompt-tokens 255000 --max-tokens 256)
    if [ -n "$small" ]; then
        load_args=(--requests 8 --prompt-tokens 2000 --max-tokens 32 --cancel-prompt-tokens 16000)
        decode_ctx=16384
    fi
else  # the CPU check: the embedded demo model (4-token blocks, 4 selected a query)
    [ -n "$small" ] || { echo "mission.sh: no nvidia-smi: only --small runs here (the demo model)" >&2; exit 2; }
    common=(--slots 8 --ctx 2048 --batch-tokens 64 --prefill-batch-tokens 256 --threads 1)
    paged=("${common[@]}" --kv-offload host --hot-blocks 8)
    unpaged=("${common[@]}" --kv-offload none)
    decode_model=$($py -c "from pyqsa.demo_model import demo_model_path; print(demo_model_path())")
    decode_ctx=2048 decode_extra=(--ubatch 256 --steps 4 --warmup 1 --no-extra-bufts --threads 1)
    load_args=(--requests 8 --prompt-tokens 300 --max-tokens 64 --cancel-prompt-tokens 1900)
fi

rerun="tests/gpu/mission.sh ${small:+--small }${locality:+--locality }$phase"
. tests/gpu/serve_lib.sh

load() {  # which, extra load flags...
    local which=$1 url
    shift
    [ -f "$state/$which-baseline.json" ] || { echo "no $which baseline: run start-$which first" >&2; exit 1; }
    url=$(url_of "$which")
    job "$which-load-job" "$state/$which-load.json" "$py" bench/mission.py load "$url" \
        --baseline "$state/$which-baseline.json" --smi "$state/$which-smi.csv" \
        --out "$state/$which-load.json" --serve-flags "$(cat "$state/$which.flags")" "${load_args[@]}" "$@"
}

decode_py() {
    stop_server paged
    stop_server unpaged
    local hot
    hot=$("$py" -c "import json,sys; print(int(json.load(open(sys.argv[1]))['hot_blocks']))" \
        "$state/paged-baseline.json") || { echo "no paged baseline: its hot blocks are unknown" >&2; exit 1; }
    job decode-py "$state/decode.done" sh -c "\"\$@\" && touch $state/decode.done" decode \
        "$py" bench/decode.py "$decode_model" --variant pyqsa --hot-blocks "$hot" --contexts "$decode_ctx" \
        --seqs 8 "${decode_extra[@]}" --out "$state/decode.jsonl"
}

report() {  # a --small run's record stays out of bench/results
    local results=()
    [ -n "$small" ] || results=(--results bench/results)
    "$py" bench/mission.py report --state "$state" --decode "$state/decode.jsonl" "${results[@]}" \
        --copy-to "$out" ${locality:+--kind locality}
}

case "$phase" in
    start-paged) start_server paged "${paged[@]}" ;;
    load-paged) load paged --cancel-checks ;;
    start-unpaged)
        if alive "$state/paged-load-job.pid" && [ ! -f "$state/paged-load.json" ]; then
            echo "the paged load still runs: run load-paged first" >&2; exit 1
        fi
        stop_server paged
        start_server unpaged "${unpaged[@]}" ;;
    load-unpaged) load unpaged ;;
    decode-py) decode_py ;;
    report) report ;;
    stop)
        stop_server paged
        stop_server unpaged
        for j in paged-load-job unpaged-load-job decode-py; do
            alive "$state/$j.pid" && kill -- "-$(cat "$state/$j.pid")" && echo "stopped $j"
        done ;;
    all)
        t_end=$(( $(date +%s) + 86400 ))
        start_server paged "${paged[@]}" && load paged --cancel-checks && stop_server paged &&
            start_server unpaged "${unpaged[@]}" && load unpaged && decode_py && report ;;
    *) echo "mission.sh: unknown phase $phase" >&2; exit 2 ;;
esac
