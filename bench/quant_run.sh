#!/usr/bin/env bash
# GPU machine, after bench/gpu_run.sh (pyqsa's CUDA build and the synthetic model): the model
# quantized by `pyqsa quantize` and by upstream's llama-quantize (carried for this pin, or built
# here from the same carried extract, CPU only, on the first call), each file's size and quantize
# time, then bench/decode.py
# (pyqsa's library) on the f16 source and on every quantized file, per context cheapest first.
#   device run:  carry [".gpu-carry"], command: bench/quant_run.sh --commit <sha> [options]
#   options:     --commit SHA (recorded as the commit, as gpu_run.sh's)
#                --budget S (default 540: seconds from start until no new run may begin)
#                --types Q8_0,Q4_K_M  --tools pyqsa,llama-quantize  --contexts 32768,262144
#                --seqs 1,8  --steps 32  --warmup 4  --decode-args "..." (e.g. "--repeats 3")
#                --variants pyqsa (pyqsa's library variants of bench/variants.sh each file runs under,
#                in this order, e.g. pyqsa,quantup)
#                --no-f16 (no decode runs of the f16 source)
#                --small | --real-moe (gpu_run.sh's model of that flag; --real-moe's 33.3 GiB
#                source and its four quantized files need about 90 GiB: on the 64 GiB disk give
#                one --types and one --tools a call, with --remove)
#                --remove (delete this call's quantized files after its decode runs)
#                --model PATH (any qwen4exp GGUF instead of gpu_run.sh's)
#                --llama-quantize PATH (upstream's llama-quantize built elsewhere from the same pin:
#                no build here; without it, .gpu-carry/llama-quantize when its stamp names the pin)
#                --cpu (the CPU check: no nvidia-smi, the CPU build, decode.py's CPU flags)
#   env:         PYQSA_BENCH_WORK (default .build/bench: the models, quant/, logs/, history)
# Quantized files stay in .build/bench/quant/ (a second call reuses them and quantizes nothing),
# so the long contexts can get a call of their own (--contexts 262144).
# Results in $OUT: quant.jsonl (a record per file: tool, type, bytes, seconds, bytes by tensor
# type), decode.jsonl (decode.py's records; "model" names the file), quant-report.md (the table),
# <date>-<commit>-quant.json (for bench/results/), commands.txt, quant_run.log.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
invocation="bench/quant_run.sh $*"
budget=540 types=Q8_0,Q4_K_M tools=pyqsa,llama-quantize contexts=32768,262144 seqs=1,8
steps=32 warmup=4 decode_args= kind= model= f16=1 cpu= remove= qbin= variants=pyqsa hot_blocks=1024
while [ $# -gt 0 ]; do
    case "$1" in
        --small) kind=small-; shift; continue ;;
        --real-moe) kind=realmoe-; shift; continue ;;
        --no-f16) f16=; shift; continue ;;
        --cpu) cpu=1; shift; continue ;;
        --remove) remove=1; shift; continue ;;
        --commit) export PYQSA_BENCH_COMMIT=$2 ;;
        --budget) budget=$2 ;;
        --types) types=$2 ;;
        --tools) tools=$2 ;;
        --contexts) contexts=$2 ;;
        --seqs) seqs=$2 ;;
        --steps) steps=$2 ;;
        --warmup) warmup=$2 ;;
        --decode-args) decode_args=$2 ;;
        --variants) variants=$2 ;;
        --model) model=$2 ;;
        --llama-quantize) qbin=$2 ;;
        *) echo "quant_run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
for tool in ${tools//,/ }; do
    case "$tool" in pyqsa|llama-quantize) ;; *) echo "quant_run.sh: unknown tool $tool" >&2; exit 2 ;; esac
done
. bench/variants.sh
for v in ${variants//,/ }; do
    [[ -n "${variant_args[$v]:-}" && $v != upstream ]] || { echo "quant_run.sh: unknown variant $v" >&2; exit 2; }
done
if [ -n "$qbin" ] && [ ! -x "$qbin" ]; then
    echo "quant_run.sh: --llama-quantize $qbin: no such program" >&2; exit 2
fi
deadline=$((t_start + budget))
out=${OUT:-/tmp/pyqsa-bench-out}
work=${PYQSA_BENCH_WORK:-.build/bench}
logs=$work/logs
qdir=$work/quant
mkdir -p "$out" "$logs" "$qdir"
exec > >(tee -a "$out/quant_run.log") 2>&1
export PYTHONUNBUFFERED=1
elapsed() { echo "$(( $(date +%s) - t_start )) s"; }

lib=.build/py/llama_cpp/lib
decode_flags=()
if [ -n "$cpu" ]; then
    # NOTE: as tests/unit/bench_scripts.py: no CPU weight repacking (the pinned AMX f16 kernel
    # crashes with 8 streams)
    decode_flags=(--no-extra-bufts)
else
    command -v nvidia-smi > /dev/null || { echo "quant_run.sh: no nvidia-smi (--cpu for the CPU check)" >&2; exit 2; }
    compgen -G ".gpu-carry/*.whl" > /dev/null || { echo "no .gpu-carry: run bench/pack.sh, carry .gpu-carry" >&2; exit 2; }
    python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/pyqsa-site .gpu-carry/*.whl
    export PYTHONPATH=/tmp/pyqsa-site
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
[ -f "$lib/libllama.so" ] || { echo "quant_run.sh: no $lib/libllama.so: run bench/gpu_run.sh first" >&2; exit 2; }
if [ -z "$model" ]; then
    model=$(ls "$work"/flash-next-synth-"$kind"????????????.gguf 2> /dev/null | head -n 1)
    [ -n "$model" ] || { echo "quant_run.sh: no $work/flash-next-synth-$kind*.gguf: run bench/gpu_run.sh${kind:+ --${kind%-}} first" >&2; exit 2; }
fi
echo "model $model ($(du -h "$model" | cut -f1)), repo ${PYQSA_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
echo "# $invocation" >> "$out/commands.txt"

# upstream's llama-quantize: --llama-quantize's, else the carried one when its stamp names this
# pin (tests/gpu/prebuild.sh with PREBUILD_QUANTIZE=1), else built here from the carried extract
# (gpu_run.sh unpacks it into .build/upstream), a CPU-only build (quantize_build)
. tests/gpu/prebuilt.sh
if [ -z "$qbin" ] && [ -f .gpu-carry/llama-quantize ] &&
    [ "$(head -n 1 .gpu-carry/llama-quantize.stamp 2> /dev/null)" = "$(quantize_pin)" ]; then
    qbin=$work/llama-quantize-carried
    install -m 755 .gpu-carry/llama-quantize "$qbin"
fi
qbin=${qbin:-$work/upstream-quantize/bin/llama-quantize}
if [[ ,$tools, == *,llama-quantize,* ]] && [ ! -x "$qbin" ]; then
    echo "building upstream's llama-quantize ($(elapsed))"
    if ! quantize_build "$(echo .build/upstream/llama_cpp_python-*/vendor/llama.cpp)" "$work/upstream-quantize" \
            "$(nproc)" > "$logs/build-llama-quantize.log" 2>&1; then
        echo "llama-quantize build: FAILED, log tail:"; tail -n 30 "$logs/build-llama-quantize.log"; exit 1
    fi
    echo "llama-quantize built ($(elapsed))"
fi
[[ ,$tools, != *,llama-quantize,* ]] || echo "llama-quantize: $qbin"

# (a) the quantized files, each once (kept for later calls)
status=0
files=()
[ -n "$f16" ] && files+=("$model")
for t in ${types//,/ }; do
    for tool in ${tools//,/ }; do
        f=$qdir/$(basename "$model" .gguf)-$tool-$t.gguf
        files+=("$f")
        seconds=null
        if [ ! -f "$f" ]; then
            echo "quantize: $tool $t ($(elapsed))"
            t0=$(date +%s.%N)
            if [ "$tool" = pyqsa ]; then
                cmd=(python3 -m pyqsa.cli quantize "$model" "$f" "$t" --quiet)
            else  # llama-quantize writes in place: a temp name, renamed when whole
                cmd=("$qbin" "$model" "$f.part" "$t" "$(nproc)")
            fi
            echo "${cmd[*]}" >> "$out/commands.txt"
            if "${cmd[@]}" > "$logs/quantize-$tool-$t.log" 2>&1; then
                [ "$tool" = pyqsa ] || mv "$f.part" "$f"
                seconds=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)")
            else
                echo "quantize $tool $t: FAILED, log tail:"; tail -n 20 "$logs/quantize-$tool-$t.log"
                rm -f "$f.part"; status=1; continue
            fi
        fi
        python3 bench/quant_record.py "$f" --source "$model" --tool "$tool" --type "$t" \
            --seconds "$seconds" >> "$out/quant.jsonl"
    done
done

# (b) decode runs, cheapest context first, every file at each under each variant
for c in ${contexts//,/ }; do
    for f in "${files[@]}"; do
        [ -f "$f" ] || continue
        for v in ${variants//,/ }; do
            if [ "$(date +%s)" -ge "$deadline" ]; then
                echo "budget spent: $(basename "$f") at $c ($v) not run"
                continue
            fi
            cmd=(env ${variant_env[$v]:-} python3 bench/decode.py "$f" ${variant_args[$v]} --lib "$lib" --contexts "$c"
                 --seqs "$seqs" --steps "$steps" --warmup "$warmup" --out "$out/decode.jsonl"
                 --out "$work/history.jsonl" --deadline "$deadline" ${decode_flags[@]+"${decode_flags[@]}"} $decode_args)
            echo "${cmd[*]}" >> "$out/commands.txt"
            log=$logs/decode-quant-$(basename "$f" .gguf)-$v-$c.log
            echo "run: $(basename "$f") at $c, $v ($(elapsed))"
            "${cmd[@]}" > /dev/null 2> "$log" || {
                echo "$(basename "$f") at $c ($v): FAILED, log tail:"; tail -n 20 "$log"; status=1
            }
        done
    done
done
if [ -n "$remove" ]; then
    for f in "${files[@]}"; do [ "$f" = "$model" ] || rm -f "$f"; done
fi
python3 bench/quant_report.py "$out/quant.jsonl" "$out/decode.jsonl" --save "$out" \
    | tee "$out/quant-report.md" || status=1
echo "done ($(elapsed))"
exit $status
