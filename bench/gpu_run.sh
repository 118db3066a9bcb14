#!/usr/bin/env bash
# GPU machine: decode benchmark, pyqsa (sparse QSA) against unpatched upstream (masked dense QSA),
# same GPU, same synthetic Flash-Next-shaped model, same flags, one call.
#   here first:   bench/pack.sh (and tests/gpu/prebuild.sh: pyqsa's CUDA build made here, carried)
#   device run:   carry [".gpu-carry", ".gpu-carry-upstream"] (the second, upstream's prebuilt library,
#                 only where the upstream variant runs: without it the machine builds upstream),
#                 command: bench/gpu_run.sh --commit <sha> [options]
#   options:      --commit SHA (recorded as the commit when the tree there has no .git)
#                 --budget S (default 540: seconds from start until no new run may begin)
#                 --contexts 8192,32768,131072,262144  --seqs 1,8  --steps 32  --warmup 4
#                 --small (the tiny model of synth_model.py --small: a smoke test of the script)
#                 --locality (the model of synth_model.py --locality, whose indexer prefers stable
#                 blocks as trained models do: the paged variants' hit rate of a trained model, not
#                 random weights' worst case; a model of its own beside the default one)
#                 --real-moe (the model of synth_model.py --real-moe: the real 512 experts top-10 and
#                 vocab 248320, 8 layers (2 QSA) instead of 48, 33.3 GiB: MoE products at the
#                 shape users run; a model of its own, which first removes the other full-shape
#                 models of .build/bench for disk; combines with --small and --locality)
#                 --variants pyqsa,upstream (which libraries run, in this order, per context;
#                 paged: pyqsa's with host-backed KV paging, --hot-blocks N, default 1024;
#                 pagedq8: the same with q8_0 K/V (host store and hot cache);
#                 pagedq8f16: a q8_0 host store under an f16 hot cache (blocks dequantized as fetched);
#                 sampled: pyqsa's with each step's rows drawn by the sample op, --sampling device;
#                 cores: pyqsa's with PYQSA_QSA_ATTN_MMA=0, attention on CUDA cores (prefill and decode);
#                 moesync: pyqsa's with PYQSA_CUDA_MOE_SYNC=1, upstream's host-sorted MoE products;
#                 f16acc: pyqsa's with PYQSA_CUDA_F16_ACCUMULATE=1, upstream's f16 sums on cuBLAS and MMVF;
#                 gdnup: pyqsa's with PYQSA_CUDA_GDN_UPSTREAM=1, upstream's gated-delta-rule kernel;
#                 moemmf: pyqsa's with PYQSA_CUDA_MOE_MMF=1, MoE products of every batch on MMF;
#                 gemvup: pyqsa's with PYQSA_CUDA_GEMV_UPSTREAM=1, decode products (1-8 columns) on upstream's MMVF/MMF;
#                 hcunf: pyqsa's with PYQSA_HC_UNFUSED=1, the hyper-connection combine and gate as upstream's ops;
#                 ungrp: pyqsa's with PYQSA_CUDA_PRODUCTS_UNGROUPED=1, a decode step's products of one x a launch each;
#                 gatesunf: pyqsa's with PYQSA_GATES_UNFUSED=1, the linear attention's and shared expert's gates as upstream's ops;
#                 topk1: pyqsa's with PYQSA_CUDA_TOPK_ONE_CTA=1, a decode step's top-k rows on one CTA each, no cluster;
#                 hcmixunf: pyqsa's with PYQSA_HC_MIX_UNFUSED=1, a decode step's hyper-connection mixes as upstream's ops;
#                 combapart: pyqsa's with PYQSA_CUDA_HC_COMBINE_APART=1, each combine of hyper-connections a launch of its own;
#                 joinunf: pyqsa's with PYQSA_HC_JOIN_UNFUSED=1, the MoE's gated join an op of its own, not inside the combine after it;
#                 gdnconvapart: pyqsa's with PYQSA_CUDA_GDN_CONV_APART=1, a decode step's gdn_gates a launch of its own, not conv_step's;
#                 inputsync: pyqsa's with PYQSA_SCHED_INPUTS_SYNC=1, upstream's synchronous copy of each host input, not queued from a stage;
#                 chunk1: pyqsa's with PYQSA_CUDA_GEMV_ONE_CHUNK=1, q4_K's, q5_K's and q6_K's decode products one 8-weight chunk a lane-step;
#                 fastoff: pyqsa's with every switch of the decode fast path at once (gemvup, ungrp,
#                 hcunf, gatesunf, hcmixunf, topk1, inputsync): upstream's decode path, pyqsa's attention;
#                 mix8: pyqsa's with PYQSA_HC_MIX_TOKENS=8, the hyper-connection mixes of steps of up to 8 tokens as hc_down and hc_pre;
#                 quantup: pyqsa's with gemvup and hcmixunf at once: a quantized file's decode products and
#                 one-sequence mixes on upstream's MMVQ and ops, as before pyqsa's gemv read quantized weights;
#                 the table of them all: bench/variants.sh)
#                 --decode-args "..." (more decode.py options, e.g. "--ubatch 1024 --repeats 3")
#                 --serve "SERVE FLAGS" (after the decode runs: bench/serve_run.sh, the server
#                 benchmark, with these extra serve flags, e.g. "--sampling device"; "" for none)
#                 --checks (after the builds: the op-check binaries (test-qsa-ops, test-qsa-page, test-sample,
#                 test-products, test-gdn, test-fused, test-input-stage) CUDA vs CPU and
#                 their timings, tests/gpu/paging.sh, tests/gpu/sampling.sh, tests/gpu/serve_paged.sh (serve --slots 8
#                 --ctx 262144 with paging, 8 concurrent requests), then tests/gpu/parity.sh)
#                 --op-checks (the first part of --checks only: the op-check binaries, CUDA vs CPU
#                 and their timings, then tests/gpu/fast_path.py (greedy outputs with the fused
#                 ops and without, bit for bit); a few minutes where --checks takes many)
#                 --profile (after the timed runs: one run of pyqsa's library at the first context
#                 and --seqs under the kernel profiler (decode.py --profile), its tables of kernel
#                 time and launches a step in $OUT/kernels.txt; never timed)
#                 --dev (the studies of native/dev, each built with nvcc and run while the builds
#                 run (180 s at most each), finished before any timing; each one's output in
#                 $OUT/dev-NAME.txt)
# Steps: unpack the carried upstream extract; build pyqsa's CUDA variant (setup path) and an
# unpatched upstream CUDA `llama` in .build/bench/upstream-cuda, while the model is written to
# .build/bench/ (all three in parallel); then decode.py per context, cheapest first, pyqsa then
# upstream, each skipping a context whose estimated prefill would overrun the budget. A warm
# machine keeps .build/: a second call rebuilds nothing and reuses the model, so the long
# contexts can get a call of their own (e.g. --contexts 131072,262144).
# Results ($OUT takes 8 files at most): decode.jsonl (JSON lines, see bench/decode.py),
# commands.txt, report.txt, gpu_run.log (with the tail of any failing step's log; the full
# logs stay in .build/bench/logs/ on the machine); with --profile kernels.txt; with --checks
# also ops-perf.txt, the paging and serve logs and tests/gpu/parity.sh's three logs (past 8
# files, the last are left out, so --serve, which adds serve-bench.jsonl, goes in a call without
# --checks).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
invocation="bench/gpu_run.sh $*"
budget=540 contexts=8192,32768,131072,262144 seqs=1,8 steps=32 warmup=4 small= locality= realmoe=
variants=pyqsa,upstream checks= op_checks= dev= profile= hot_blocks=1024 serve= decode_args=
while [ $# -gt 0 ]; do
    case "$1" in
        --small) small=--small; shift; continue ;;
        --locality) locality=--locality; shift; continue ;;
        --real-moe) realmoe=--real-moe; shift; continue ;;
        --checks) checks=1; shift; continue ;;
        --op-checks) op_checks=1; shift; continue ;;
        --dev) dev=1; shift; continue ;;
        --profile) profile=1; shift; continue ;;
        --commit) export PYQSA_BENCH_COMMIT=$2 ;;
        --budget) budget=$2 ;;
        --contexts) contexts=$2 ;;
        --seqs) seqs=$2 ;;
        --steps) steps=$2 ;;
        --warmup) warmup=$2 ;;
        --decode-args) decode_args=$2 ;;
        --variants) variants=$2 ;;
        --hot-blocks) hot_blocks=$2 ;;
        --serve) serve="run $2" ;;
        *) echo "gpu_run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
. bench/variants.sh
for v in ${variants//,/ }; do
    [ -n "${variant_args[$v]:-}" ] || { echo "gpu_run.sh: unknown variant $v" >&2; exit 2; }
done
lib_of() {  # a variant's library folder
    if [ "$1" = upstream ]; then echo "$work/upstream-cuda/bin"; else echo .build/py/llama_cpp/lib; fi
}
deadline=$((t_start + budget))
out=${OUT:-/tmp/pyqsa-bench-out}
work=.build/bench
logs=$work/logs
mkdir -p "$out" "$logs"
exec > >(tee -a "$out/gpu_run.log") 2>&1
export PYTHONUNBUFFERED=1
elapsed() { echo "$(( $(date +%s) - t_start )) s"; }

# (a) below replaces .build/llama.cpp: a slip on the development machine would take its tree
command -v nvidia-smi > /dev/null || { echo "gpu_run.sh: no nvidia-smi; it runs on the GPU machine" >&2; exit 2; }
for f in upstream-extract.tar.gz ggml-vocab-qwen35.gguf; do
    [ -f ".gpu-carry/$f" ] || { echo "no .gpu-carry/$f: run bench/pack.sh, carry .gpu-carry"; exit 2; }
done

# (a) the carried extract, unpacked again only when the carry changed (a warm machine keeps it)
stamp=$(sha256sum .gpu-carry/upstream-extract.tar.gz | cut -c1-16)
if [ "$(cat .build/upstream/.carry-stamp 2>/dev/null)" != "$stamp" ]; then
    rm -rf .build/upstream .build/llama.cpp "$work/upstream-cuda"
    mkdir -p .build/upstream
    tar -C .build/upstream -xzf .gpu-carry/upstream-extract.tar.gz
    echo "$stamp" > .build/upstream/.carry-stamp
fi
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/pyqsa-site .gpu-carry/*.whl
export PYTHONPATH=/tmp/pyqsa-site
src=$(echo .build/upstream/llama_cpp_python-*/vendor/llama.cpp)
# the extract leaves the vocab GGUFs out; the demo model (tests/gpu/fast_path.py) reads this one
mkdir -p "$src/models"
[ -f "$src/models/ggml-vocab-qwen35.gguf" ] || cp .gpu-carry/ggml-vocab-qwen35.gguf "$src/models/"
commit=$(sed -n 's/^llama_cpp_commit *= *//p' UPSTREAM)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "repo ${PYQSA_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}, upstream $commit"

# the dev corner's studies (standalone CUDA files) on the GPU while the CPUs build
dev_pids=()
if [ -n "$dev" ]; then
    for f in native/dev/*.cu; do
        [ -e "$f" ] || continue  # no study open
        name=$(basename "$f" .cu)
        (nvcc -std=c++17 -O3 -arch=sm_90a -Inative/ggml/cuda "$f" -o "/tmp/dev-$name" && timeout 180 "/tmp/dev-$name") \
            > "$out/dev-$name.txt" 2>&1 &
        dev_pids+=("$name:$!")
    done
fi

# (b) both CUDA builds (upstream's only when a variant runs it) and (c) the model, in parallel.
# Each is the one tests/gpu/prebuild.sh made on the development machine when the carry holds it
# for this tree (pyqsa's) or this pin (upstream's) and it runs here (tests/gpu/prebuilt.sh), else
# built here as before.
. tests/gpu/prebuilt.sh
(
    export PYQSA_CUDA=1 PYQSA_BUILD_JOBS=$(nproc)
    prebuilt_install || python3 -m pip install -q --no-build-isolation --no-deps --no-index -e .
) > "$logs/build-pyqsa.log" 2>&1 &
pid_pyqsa=$!
pid_upstream=
[[ ,$variants, == *,upstream,* ]] && (
    upstream_prebuilt_install "$work/upstream-cuda" "${src%/vendor/llama.cpp}" && exit 0
    upstream_configure "$src" "$work/upstream-cuda" 90a ""
    cmake --build "$work/upstream-cuda" -j "$(nproc)" --target llama
) > "$logs/build-upstream.log" 2>&1 &
[[ ,$variants, == *,upstream,* ]] && pid_upstream=$!
# the model's name follows the generator and vocab, so a changed generator writes a new one; each
# kind (default, small, realmoe, locality and their combinations) replaces only its own older
# files, but the full-shape real-MoE one (33.3 GiB on a 64 GiB disk) replaces all full-shape ones
# and their quantized files in quant/ (bench/quant_run.sh's: 17 GiB for the default model's four)
mhash=$(cat bench/synth_model.py .gpu-carry/ggml-vocab-qwen35.gguf | sha256sum | cut -c1-12)
kind=${small:+-small}${realmoe:+-realmoe}${locality:+-locality}
model="$work/flash-next-synth$kind-$mhash.gguf"
if [ ! -f "$model" ]; then
    rm -f "$work"/flash-next-synth"$kind"-????????????.gguf
    if [ -n "$realmoe" ] && [ -z "$small" ]; then
        rm -f "$work"/flash-next-synth{,-locality,-realmoe,-realmoe-locality}-????????????.gguf
        h=$(printf '[0-9a-f]%.0s' {1..12})
        rm -f "$work"/quant/flash-next-synth{,-locality,-realmoe,-realmoe-locality}-$h-*.gguf
    fi
    python3 bench/synth_model.py "$model" $small $realmoe $locality \
        --vocab .gpu-carry/ggml-vocab-qwen35.gguf \
        > "$logs/synth.log" 2>&1 &
    pid_model=$!
else
    echo "model $model already written" > "$logs/synth.log"
    pid_model=
fi
status=0
for job in build-pyqsa:$pid_pyqsa ${pid_upstream:+build-upstream:$pid_upstream} ${pid_model:+synth:$pid_model}; do
    if wait "${job#*:}"; then echo "${job%%:*}: done ($(elapsed))"; else
        echo "${job%%:*}: FAILED ($(elapsed)), log tail:"
        tail -n 30 "$logs/${job%%:*}.log"
        status=1
    fi
done
grep -h '^prebuilt' "$logs/build-pyqsa.log" "$logs/build-upstream.log" 2> /dev/null || true  # whether the carried builds served
tail -n 1 "$logs/synth.log"
for job in ${dev_pids[@]+"${dev_pids[@]}"}; do  # a study's failure is a finding, not a failed run
    if wait "${job#*:}"; then r=passed; else r=FAILED; fi
    echo "study ${job%%:*}: $r ($(elapsed)), its last lines:"; tail -n 8 "$out/dev-${job%%:*}.txt"
done
[ $status -eq 0 ] || exit 1
# an op-check binary's CUDA-vs-CPU test (a crash too: its log's tail is shown), then its timings
op_check() {  # binary, label, timing-line pattern
    if ".build/cmake-cuda/bin/$1" test -b CUDA0 > "$logs/$1.log" 2>&1; then
        echo "$2 CUDA vs CPU: $(tail -n 1 "$logs/$1.log")"
    else
        echo "$2 CUDA vs CPU: FAILED, log tail:"; grep -v ": OK$" "$logs/$1.log" | tail -n 20; status=1
    fi
    ".build/cmake-cuda/bin/$1" perf -b CUDA0 2>&1 | grep -E "$3" >> "$out/ops-perf.txt" || true
}
if [ -n "$checks$op_checks" ]; then
    : > "$out/ops-perf.txt"
    op_check test-qsa-ops "pyqsa ops" "us/run"
    op_check test-qsa-page "pyqsa paging ops" "us/(step|run)"
    op_check test-sample "sample op" "us/step"
    op_check test-products "matrix products" "us/run"
    op_check test-gdn "gated delta rule" "us/run"
    op_check test-fused "fused ops" "us/run"
    op_check test-input-stage "input stage" "us"
    cat "$out/ops-perf.txt"
    # greedy tokens with the fused ops and without, 1 and 8 slots, 256 steps (the demo model)
    python3 tests/gpu/fast_path.py > "$out/fast-path.txt" 2>&1 || status=1
    tail -n 6 "$out/fast-path.txt"
    echo "op checks done ($(elapsed))"
fi
if [ -n "$checks" ]; then
    tests/gpu/paging.sh || { echo "paging checks: FAILED"; status=1; }
    tests/gpu/sampling.sh || { echo "sampling checks: FAILED"; status=1; }
    tests/gpu/serve_paged.sh || { echo "serve with paging: FAILED"; status=1; }
    tests/gpu/parity.sh || { echo "checks: FAILED"; status=1; }
    echo "checks done ($(elapsed))"
fi

# (d) decode runs, cheapest first, pyqsa then upstream per context, on one GPU (a machine with
# more would have llama.cpp split the layers over all of them)
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
echo "# $invocation; env: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES PYTHONPATH=$PYTHONPATH" \
    >> "$out/commands.txt"
for c in ${contexts//,/ }; do
    for v in ${variants//,/ }; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "budget spent: context $c ($v) not run"
            continue
        fi
        cmd=(env ${variant_env[$v]:-} python3 bench/decode.py "$model" ${variant_args[$v]} --lib "$(lib_of "$v")"
             --contexts "$c" --seqs "$seqs" --steps "$steps" --warmup "$warmup"
             --out "$out/decode.jsonl" --out "$work/history.jsonl" --deadline "$deadline"
             $decode_args)
        echo "${cmd[*]}" >> "$out/commands.txt"
        echo "run: $v at $c ($(elapsed))"
        "${cmd[@]}" > /dev/null 2> "$logs/decode-$v-$c.log" || {
            echo "$v at $c: FAILED, log tail:"; tail -n 20 "$logs/decode-$v-$c.log"; status=1
        }
    done
done
if [ -n "$profile" ]; then
    c=${contexts%%,*}
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "budget spent: no kernel profile"; else
        cmd=(python3 bench/decode.py "$model" --variant pyqsa --lib "$(lib_of pyqsa)" --contexts "$c"
             --seqs "$seqs" --steps "$steps" --warmup "$warmup" --profile "$out/kernels.txt")
        echo "${cmd[*]}" >> "$out/commands.txt"
        echo "kernel profile: pyqsa at $c ($(elapsed))"
        "${cmd[@]}" > /dev/null 2> "$logs/profile.log" && grep '^## ' "$out/kernels.txt" || {
            echo "kernel profile: FAILED, log tail:"; tail -n 20 "$logs/profile.log"; status=1
        }
    fi
fi
[ -f "$out/decode.jsonl" ] && python3 bench/report.py "$out/decode.jsonl" --no-save | tee "$out/report.txt" || true
if [ -n "$serve" ]; then
    echo "serve benchmark ($(elapsed))"
    # shellcheck disable=SC2086  # the serve flags are words
    bench/serve_run.sh ${serve#run } || { echo "serve benchmark: FAILED"; status=1; }
fi
echo "done ($(elapsed))"
exit $status
