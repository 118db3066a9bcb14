"""The benchmark scripts end to end on CPU: the --small synthetic model, decode.py at a tiny
context (1 and 8 sequences, through LLAMA_CPP_LIB_PATH), report.py over its records."""

import json
import re
import subprocess
import sys

import pytest
from bench_scripts import BENCH, DECODE_ARGS, LIB, decode_records, run, small_model


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    return small_model(tmp_path_factory.mktemp("bench") / "small.gguf")


def test_small_model_shape(small_gguf):
    from pyqsa.convert.gguf_file import GGUFFile

    g = GGUFFile(small_gguf)
    assert g.get("general.architecture") == "qwen4exp"
    assert g.get("qwen4exp.block_count") == 8
    assert len(g.get("tokenizer.ggml.tokens")) == 151936
    types = {t.name: t.qtype.name for t in g.tensors}
    assert types["blk.0.attn_qkv.weight"] == "F16"  # f16 matrices, f32 norms
    assert types["blk.3.attn_k_norm.weight"] == "F32"


def test_decode_records(small_gguf, tmp_path):
    out = tmp_path / "decode.jsonl"
    recs = decode_records(small_gguf, out)
    pre, one, eight = recs
    assert pre["context"] == 256 and pre["tokens"] == 256 - 3 * 2 and pre["tok_s"] > 0
    assert pre["warmup_batches"] == 1  # untimed, removed again: the copies below still match
    assert pre["ledger"]["host.kv"] > 0 and pre["ledger"]["host.weights"] > 0  # CPU: all host
    for r in recs:
        assert r["variant"] == "pyqsa" and r["pyqsa_version"].startswith("pyqsa")
        assert r["upstream_commit"] and r["lib"] == str((LIB / "libllama.so").resolve())
        assert "commit" in r and "gpu" in r
    for r in (one, eight):
        assert r["flags"]["flash_attn"] == "enabled" and r["flags"]["kv_unified"] is False
        assert r["flags"]["qsa_mode"] == "positional" and r["flags"]["type_k"] == "f16"
        assert r["flags"]["n_seq_max"] == 8 and r["flags"]["n_ctx"] == 256 * 8
        assert len(r["step_ms"]) == 2 and r["step_ms_median"] > 0
        assert r["tok_s"] == pytest.approx(r["n_seq"] * 1e3 / r["step_ms_median"])
        assert r["logits_finite"] and r["copy_max_abs_diff"] == 0.0
    assert one["pos_start"] == 250 and eight["pos_start"] == 253

    # the library folder decides the variant: pyqsa's build is refused as "upstream"
    args = [*DECODE_ARGS, "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "decode.py"), str(small_gguf), "--variant", "upstream", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "is a pyqsa build" in proc.stderr

    rep = run(str(BENCH / "report.py"), str(out), "--no-save")
    assert "## Decode" in rep.stdout and "## Prefill" in rep.stdout


def test_decode_repeats_and_their_median(small_gguf, tmp_path):
    """--repeats: decode runs one after another after one prefill, each a record; report.py
    takes the median over them and shows their spread."""
    out = tmp_path / "decode.jsonl"
    args = ["--contexts", "256", "--seqs", "2", "--steps", "2", "--warmup", "1", "--repeats", "3"]
    args += ["--threads", "1", "--no-extra-bufts", "--lib", str(LIB), "--out", str(out)]
    run(str(BENCH / "decode.py"), str(small_gguf), "--variant", "pyqsa", *args)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["kind"], r.get("repeat")) for r in recs] == [
        ("prefill", None),
        ("decode", 0),
        ("decode", 1),
        ("decode", 2),
    ]
    assert recs[0]["tokens"] == 256 - 3 * 3
    assert [r["pos_start"] for r in recs[1:]] == [247, 250, 253]
    # only the first run decodes fresh copies of sequence 0; later ones hold diverged sequences
    assert recs[1]["copy_max_abs_diff"] == 0.0
    assert all("copy_max_abs_diff" not in r for r in recs[2:])
    # the later runs' steps each kept the graph of the step before (the first run's first timed
    # step, the second after the prefill, may build one); the CPU build has no CUDA counts
    assert all(set(r["graphs_per_step"]) == {"reused"} for r in recs[1:])
    assert [r["graphs_per_step"]["reused"] for r in recs[2:]] == [1.0, 1.0]
    rep = run(str(BENCH / "report.py"), str(out), "--no-save")
    ms = sorted(r["step_ms_median"] for r in recs[1:])
    assert f"pyqsa 256 x 2: 3 runs, {ms[0]:.2f}-{ms[2]:.2f} ms/step" in rep.stdout
    assert f"{2e3 / ms[1]:>11.1f} {ms[1]:>8.2f}" in rep.stdout  # the median run's row
    assert "max |logit diff|: 0.0\n" in rep.stdout


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--repeats", "0"),
        ("--repeats", "-2"),
        ("--repeats", "three"),
        ("--prefill-warmup", "-1"),
        ("--prefill-warmup", "one"),
    ],
)
def test_bad_counts_are_usage_errors(tmp_path, flag, value):
    """--repeats below 1, --prefill-warmup below 0, or either not a number stops decode.py with
    argparse's one-line error."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "decode.py"), str(tmp_path / "none.gguf")]
        + ["--variant", "pyqsa", flag, value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert flag.lstrip("-").split("-")[-1] in proc.stderr.splitlines()[-1]


def test_decode_with_device_sampling(small_gguf, tmp_path):
    """--sampling device: every row drawn by the sample op inside the step, a variant of its
    own; the copies of sequence 0 draw its token (one seed for all), and report.py says so."""
    out = tmp_path / "decode.jsonl"
    args = ["--contexts", "256", "--seqs", "4", "--steps", "2", "--warmup", "1"]
    args += ["--threads", "1", "--no-extra-bufts", "--lib", str(LIB), "--out", str(out)]
    run(
        str(BENCH / "decode.py"),
        str(small_gguf),
        "--variant",
        "pyqsa",
        "--sampling",
        "device",
        *args,
    )
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in recs] == ["pyqsa-sampled"] * 2
    dec = recs[1]
    assert dec["flags"]["sampling"] == "device" and dec["step_ms_median"] > 0
    assert dec["drawn_in_vocab"] and dec["copy_tokens_equal"] and "logits_finite" not in dec
    rep = run(str(BENCH / "report.py"), str(out), "--no-save")
    assert "smpld tok/s" in rep.stdout
    assert "tokens in the vocabulary: True; copies drew sequence 0's token: True" in rep.stdout
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "decode.py"),
            str(small_gguf),
            "--variant",
            "upstream",
            "--sampling",
            "device",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--sampling device needs" in proc.stderr.splitlines()[-1]


def test_decode_paged_with_q8_0(small_gguf, tmp_path):
    """--hot-blocks with --kv-type q8_0: a variant of its own (pyqsa-paged-q8), its records
    carry the K/V type and paging counters, and report.py compares it with the unpaged f16
    run; q8_0 without paging is a usage error."""
    out = tmp_path / "decode.jsonl"
    args = ["--contexts", "512", "--seqs", "2", "--steps", "2", "--warmup", "1"]
    args += ["--threads", "1", "--no-extra-bufts", "--lib", str(LIB), "--out", str(out)]
    decode = [str(BENCH / "decode.py"), str(small_gguf), "--variant", "pyqsa"]
    run(*decode, *args)
    run(*decode, "--hot-blocks", "512", "--kv-type", "q8_0", *args)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["variant"], r["kind"]) for r in recs] == [
        ("pyqsa", "prefill"),
        ("pyqsa", "decode"),
        ("pyqsa-paged-q8", "prefill"),
        ("pyqsa-paged-q8", "decode"),
    ]
    dec = recs[3]
    assert dec["flags"]["type_k"] == "q8_0" and dec["flags"]["hot_blocks"] == 512
    assert dec["paging_per_step"]["hits"] + dec["paging_per_step"]["misses"] > 0
    assert recs[1]["flags"]["type_k"] == "f16"
    rep = run(str(BENCH / "report.py"), str(out), "--no-save")
    assert "pgdq8 tok/s" in rep.stdout and "pgdq8/pyqsa" in rep.stdout
    assert "paged/pyqsa" not in rep.stdout  # no f16 paged run to compare
    ratio = recs[3]["tok_s"] / recs[1]["tok_s"]
    assert f"{ratio:>11.2f}" in rep.stdout.split("## Prefill")[0]
    proc = subprocess.run(
        [sys.executable, *decode, "--kv-type", "q8_0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--kv-type q8_0 needs --hot-blocks" in proc.stderr


# decode.py --profile with a stand-in for the CUDA kernel profiler (this machine has no GPU):
# every profiled stretch "records" 3 calls of one kernel, 120 us in all
FAKE_PROFILER = """
import sys
from pyqsa.bench import decode, decode_bench

class Recording:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.rows = [("qsa_attn_kernel", 3, 120.0)]

decode_bench.KernelProfile = Recording
decode.require_kernel_profiler = lambda: None
sys.exit(decode.main(sys.argv[1:]))
"""


def test_decode_profile_writes_kernel_tables_and_no_records(small_gguf, tmp_path):
    out, kernels = tmp_path / "decode.jsonl", tmp_path / "kernels.txt"
    args = ["--contexts", "256", "--seqs", "1,2", "--steps", "2", "--warmup", "1"]
    args += ["--threads", "1", "--no-extra-bufts", "--lib", str(LIB), "--out", str(out)]
    args += ["--ubatch", "64", "--profile", str(kernels)]
    run("-c", FAKE_PROFILER, str(small_gguf), "--variant", "pyqsa", *args)
    assert not out.exists()  # a profiling run's timings are not measurements
    text = kernels.read_text()
    assert text.startswith("# commit ") and "variant pyqsa" in text and "ubatch 64" in text
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    # the last 2 prefill batches (up to 256 - 2 x 3 decode positions), then 2 timed steps each
    assert titles == [
        "## prefill, the batches of 64 up to 250 tokens: 0.060 ms of kernels per step, "
        "1.5 launches of 1 kernels",
        "## decode, 1 x 251 tokens: 0.060 ms of kernels per step, 1.5 launches of 1 kernels",
        "## decode, 2 x 254 tokens: 0.060 ms of kernels per step, 1.5 launches of 1 kernels",
    ]
    assert "100.0%     0.060        1.5  qsa_attn_kernel" in text


def test_kernel_totals_and_table():
    from pyqsa.bench.kernels import kernel_totals, table

    trace = {
        "traceEvents": [
            {"cat": "kernel", "name": "b", "dur": 5.0},
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 50.0},
            {"cat": "kernel", "name": "a", "dur": 10.0},
            {"cat": "kernel", "name": "b", "dur": 7.0},
            {"cat": "kernel", "name": "c"},  # no duration: not counted
        ]
    }
    rows = kernel_totals(trace)
    assert rows == [("b", 2, 12.0), ("a", 1, 10.0)]
    text = table("t", rows, per=2, top=1).splitlines()
    assert text[0] == "## t: 0.011 ms of kernels per step, 1.5 launches of 2 kernels"
    assert text[2] == " 54.5%     0.006        1.0  b"
    assert text[3].startswith(" 45.5%     0.005") and text[3].endswith("(1 more)")


def test_prefill_estimates_for_the_budget():
    """decode.py's guess of a prefill's seconds (to skip what would overrun --budget): the
    same context as measured, a smaller one scaled down linearly from the nearest larger, a
    larger one scaled up quadratically; records of bench/results/ count when their GPU and model
    size match and their prefill batch is no larger."""
    from pyqsa.bench import decode

    def pre(variant, context, seconds):
        return {"kind": "prefill", "variant": variant, "context": context, "seconds": seconds}

    known = [pre("upstream", 8192, 1.5), pre("upstream", 131072, 47.0), pre("pyqsa", 8192, 2.0)]
    e = decode.Emitter([], {}, known)
    assert e.estimate_s("upstream", 131072) == 47.0
    assert e.estimate_s("upstream", 65536) == 23.5
    assert e.estimate_s("upstream", 262144) == 47.0 * 4
    assert e.estimate_s("pyqsa", 16384) == 8.0
    assert e.estimate_s("pyqsa-paged", 8192) is None
    # the full-shape model's size: records of it under any name (the name follows synth_model.py)
    meta = {"gpu": "NVIDIA H200", "model": "flash-next-synth-locality-0.gguf"}
    meta["model_bytes"] = 10518055040 + 32  # the locality model's metadata: a longer name
    # bench/results/2026-12-01-cecbeed-decode.json holds upstream at 256K
    found = decode.known_prefills(meta, 512)
    assert any(r["variant"] == "upstream" and r["context"] == 262144 for r in found)
    models = {r["model"] for r in found}
    assert "flash-next-synth-bb6a59d2fe27.gguf" in models
    assert all(m.startswith("flash-next-synth-") for m in models)
    assert decode.known_prefills({**meta, "model_bytes": 87777792}, 512) == []  # --small
    assert all(r["flags"]["n_batch"] == 512 and r["gpu"] == "NVIDIA H200" for r in found)
    # a larger prefill batch: the smaller batch's times bound its own (cecbeed's upstream at
    # 128K, 47 s at 512, instead of 8K's 1.5 s at 2048 scaled up quadratically to 384 s)
    found = decode.known_prefills(meta, 2048)
    assert all(r["flags"]["n_batch"] in (512, 2048) for r in found)
    e = decode.Emitter([], {}, found)
    assert 0 < e.estimate_s("upstream", 131072) < 60
    assert decode.known_prefills(meta, 256) == []  # nothing measured at 256 or less
    # the records of pyqsa bench's steps and of quant_run.sh count too: an H100's 256K prefill of
    # the f16 model (2026-12-05-9470e5e-steps.json), and of llama-quantize's Q4_K_M file (its own
    # bytes; 2026-12-06-1585184-quant.json)
    h100 = {"gpu": "NVIDIA H100 80GB HBM3", "model_bytes": 10518055040}
    assert any(r["context"] == 262144 for r in decode.known_prefills(h100, 512))
    q4 = decode.known_prefills({**h100, "model_bytes": 3650340480}, 512)
    assert {r["context"] for r in q4} == {32768, 262144}
    assert all("llama-quantize-Q4_K_M" in r["model"] for r in q4)


def test_decode_profile_without_a_cuda_profiler_is_a_one_line_error(tmp_path):
    """Here PyTorch is a CPU build: --profile stops before loading anything, with one line."""
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "decode.py"),
            str(tmp_path / "none.gguf"),
            "--variant",
            "pyqsa",
            "--contexts",
            "256",
            "--profile",
            str(tmp_path / "k.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("decode.py: --profile: ")
    assert not (tmp_path / "k.txt").exists()


@pytest.mark.parametrize(
    "env,value,variant,column",
    [
        ("PYQSA_QSA_ATTN_MMA", "0", "pyqsa-cores", "cores"),
        ("PYQSA_CUDA_MOE_SYNC", "1", "pyqsa-moesync", "mosyn"),
        ("PYQSA_CUDA_F16_ACCUMULATE", "1", "pyqsa-f16acc", "f16ac"),
        ("PYQSA_CUDA_GDN_UPSTREAM", "1", "pyqsa-gdnup", "gdnup"),
        ("PYQSA_CUDA_MOE_MMF", "1", "pyqsa-moemmf", "moemf"),
        ("PYQSA_CUDA_GEMV_UPSTREAM", "1", "pyqsa-gemvup", "gemvu"),
        ("PYQSA_HC_UNFUSED", "1", "pyqsa-hcunf", "hcunf"),
        ("PYQSA_CUDA_PRODUCTS_UNGROUPED", "1", "pyqsa-ungrp", "ungrp"),
        ("PYQSA_GATES_UNFUSED", "1", "pyqsa-gatesunf", "gatun"),
        ("PYQSA_CUDA_TOPK_ONE_CTA", "1", "pyqsa-topk1", "topk1"),
        ("PYQSA_HC_MIX_UNFUSED", "1", "pyqsa-hcmixunf", "hcmix"),
        ("PYQSA_CUDA_HC_COMBINE_APART", "1", "pyqsa-combapart", "cmbap"),
        ("PYQSA_HC_MIX_TOKENS", "8", "pyqsa-mix8", "mix8"),
        ("PYQSA_CUDA_GDN_CONV_APART", "1", "pyqsa-gdnconvapart", "gcvap"),
        ("PYQSA_HC_JOIN_UNFUSED", "1", "pyqsa-joinunf", "joinu"),
        ("PYQSA_SCHED_INPUTS_SYNC", "1", "pyqsa-inputsync", "insyn"),
        ("PYQSA_CUDA_GEMV_ONE_CHUNK", "1", "pyqsa-chunk1", "chnk1"),
    ],
)
def test_decode_under_a_library_switch_is_a_variant_of_its_own(
    small_gguf, tmp_path, monkeypatch, env, value, variant, column
):
    """gpu_run.sh's `cores` (PYQSA_QSA_ATTN_MMA=0: qsa_attn off the tensor cores),
    `moesync` (PYQSA_CUDA_MOE_SYNC=1: upstream's host-sorted MoE products), `f16acc`
    (PYQSA_CUDA_F16_ACCUMULATE=1: upstream's f16 sums), `gdnup` (PYQSA_CUDA_GDN_UPSTREAM=1:
    upstream's gated-delta-rule kernel), `moemmf` (PYQSA_CUDA_MOE_MMF=1: MoE products on MMF,
    not the grouped GEMM), `gemvup` (PYQSA_CUDA_GEMV_UPSTREAM=1: decode products of 1-8
    columns on upstream's kernels), `hcunf` (PYQSA_HC_UNFUSED=1: the hyper-connection combine
    and gate as upstream's ops), `ungrp` (PYQSA_CUDA_PRODUCTS_UNGROUPED=1: a decode step's
    products of one x a launch each), `gatesunf` (PYQSA_GATES_UNFUSED=1: the linear
    attention's and shared expert's gates as upstream's ops), `topk1`
    (PYQSA_CUDA_TOPK_ONE_CTA=1: a decode step's top-k rows on one CTA each), `hcmixunf`
    (PYQSA_HC_MIX_UNFUSED=1: a decode step's hyper-connection mixes as upstream's ops),
    `combapart` (PYQSA_CUDA_HC_COMBINE_APART=1: each combine a launch of its own), `mix8`
    (PYQSA_HC_MIX_TOKENS=8: the mixes of steps of up to 8 tokens fused), `gdnconvapart`
    (PYQSA_CUDA_GDN_CONV_APART=1: a decode step's gates a launch of their own), `joinunf`
    (PYQSA_HC_JOIN_UNFUSED=1: the MoE's join an op apart from the combine), `inputsync`
    (PYQSA_SCHED_INPUTS_SYNC=1: upstream's synchronous copy of each host input) and `chunk1`
    (PYQSA_CUDA_GEMV_ONE_CHUNK=1: q4_K/q5_K/q6_K products one chunk a lane-step) run pyqsa's
    library with one switch flipped, so decode.py records each as a variant and report.py
    gives it a column."""
    monkeypatch.setenv(env, value)
    assert_variant_with_column(small_gguf, tmp_path, variant, column)


def test_decode_with_the_fast_path_off_is_the_fastoff_variant(small_gguf, tmp_path, monkeypatch):
    """gpu_run.sh's `fastoff` (bench/variants.sh) sets every switch of decode.FAST_PATH_OFF at
    once: decode.py records the run as `pyqsa-fastoff` (not a chain of the switches' suffixes)
    and report.py gives it a column; the script's list is decode.py's."""
    from pyqsa.bench.decode import FAST_PATH_OFF

    script = (BENCH / "variants.sh").read_text()
    listed = re.search(r'\[fastoff\]="([^"]*)"', script)
    assert listed and sorted(listed.group(1).split()) == sorted(f"{n}=1" for n in FAST_PATH_OFF)
    for name in FAST_PATH_OFF:
        monkeypatch.setenv(name, "1")
    assert_variant_with_column(small_gguf, tmp_path, "pyqsa-fastoff", "fstof")


def assert_variant_with_column(small_gguf, tmp_path, variant: str, column: str) -> None:
    """decode.py's pyqsa library under this process's switches records `variant`, and report.py
    gives it the column `column`."""
    out = tmp_path / "decode.jsonl"
    run(
        str(BENCH / "decode.py"),
        str(small_gguf),
        "--variant",
        "pyqsa",
        *("--contexts", "256", "--seqs", "1", "--steps", "2", "--warmup", "1"),
        *("--threads", "1", "--no-extra-bufts", "--lib", str(LIB), "--out", str(out)),
    )
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in recs] == [variant] * 2
    assert f"{column} tok/s" in run(str(BENCH / "report.py"), str(out), "--no-save").stdout


@pytest.mark.parametrize("n_seqs", [1, 8])
def test_graph_ops_counts_what_the_fused_ops_take_out_of_a_step(small_gguf, monkeypatch, n_seqs):
    """bench/graph_ops.py on the small model (8 layers: 6 linear-attention ones, a shared
    expert in each): with PYQSA_GATES_UNFUSED=1 a decode step computes 14 nodes more a
    linear-attention layer (gates 3, q/k norms 2, the convolution 4, the gated norm 3, and the
    gathers of its two states, which the fused step reads in place) and 3 more a shared expert
    (sigmoid, mul and add, which the fused step computes inside the combine after them), as on
    the 48-layer layout (648 = 14 x 36 + 3 x 48)."""

    def computing(unfused: bool) -> dict[str, int]:
        if unfused:
            monkeypatch.setenv("PYQSA_GATES_UNFUSED", "1")
        else:
            monkeypatch.delenv("PYQSA_GATES_UNFUSED", raising=False)
        args = ["--json", "--seqs", str(n_seqs), "--prompt", "40"]
        out = run(str(BENCH / "graph_ops.py"), str(small_gguf), *args, timeout=300).stdout
        counts = json.loads(out.strip().splitlines()[-1])
        return {op: n for op, n in counts.items() if op not in ("RESHAPE", "VIEW", "TRANSPOSE")}

    fused, unfused = computing(False), computing(True)
    assert sum(unfused.values()) - sum(fused.values()) == 14 * 6 + 3 * 8
    assert unfused["GET_ROWS"] - fused["GET_ROWS"] == 2 * 6
    assert fused["PYQSA"] - unfused["PYQSA"] == 3 * 6  # gdn_gates, conv_step, norm
    assert "CONCAT" not in fused and unfused["SSM_CONV"] == 6 and unfused["SOFTPLUS"] == 6


def test_weight_floor_of_a_step(small_gguf):
    """A step reads every tensor whole but the embedding table (a row a token) and the routed
    experts (those its tokens pick: k of E at one token, nearly all of them at many)."""
    import gguf

    from pyqsa.bench.weight_floor import floor_ms, nominal_bandwidth, step_weights

    reader = gguf.GGUFReader(str(small_gguf))
    n_expert = int(reader.fields["qwen4exp.expert_count"].contents())
    n_used = int(reader.fields["qwen4exp.expert_used_count"].contents())
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    experts = sum(v for k, v in sizes.items() if "_exps." in k)
    embd = sizes["token_embd.weight"]
    assert experts > 0 and embd > 0

    one, eight, many = (step_weights(small_gguf, n) for n in (1, 8, 4096))
    assert one.experts_read == n_used and one.experts == pytest.approx(experts * n_used / n_expert)
    assert one.experts_read < eight.experts_read < many.experts_read <= n_expert
    assert many.experts == pytest.approx(experts)
    assert one.dense == eight.dense == sum(sizes.values()) - experts - embd
    assert eight.gathered == 8 * one.gathered == 8 * embd // 151936
    assert one.total < eight.total < one.dense + experts + embd

    assert nominal_bandwidth("NVIDIA H200") == 4.8e12
    assert nominal_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert nominal_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert nominal_bandwidth(None) is None and floor_ms(one, "a CPU") is None
    assert floor_ms(one, "NVIDIA H200") == pytest.approx(one.total / 4.8e12 * 1e3)


def test_report_puts_each_step_against_its_weight_floor(small_gguf, tmp_path):
    out = tmp_path / "decode.jsonl"
    recs = decode_records(small_gguf, out)
    assert all(r["weight_bytes"] > 0 and r["weight_floor_ms"] is None for r in recs[1:])
    for r in recs[1:]:  # as a run on a GPU of known bandwidth records it
        r["weight_floor_ms"] = 0.25
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep = run(str(BENCH / "report.py"), str(out), "--no-save").stdout
    for r in recs[1:]:
        over = r["step_ms_median"] / 0.25
        gb = r["weight_bytes"] / 1e9
        line = f"weight floor 256 x {r['n_seq']}: {gb:.2f} GB a step, 0.25 ms"
        assert line in rep and f"pyqsa {over:.2f}x" in rep


def test_report_reads_a_saved_results_file_and_refuses_other_files(small_gguf, tmp_path):
    """A results file under bench/results/ keeps every record, so report.py prints its tables
    again from it, the same as from decode.py's JSON lines; a file that holds no records is a
    one-line error naming the file and line, not a traceback."""
    lines = tmp_path / "decode.jsonl"
    recs = decode_records(small_gguf, lines)
    saved = tmp_path / "2026-01-01-abc1234-decode.json"
    saved.write_text(json.dumps({"note": "", "decode": [], "records": recs}, indent=1) + "\n")
    from_lines = run(str(BENCH / "report.py"), str(lines), "--no-save").stdout
    assert "## Decode" in from_lines
    assert run(str(BENCH / "report.py"), str(saved), "--no-save").stdout == from_lines

    other = tmp_path / "notes.txt"
    other.write_text('{"kind": "decode"}\nnot json\n')
    proc = subprocess.run(
        [sys.executable, str(BENCH / "report.py"), str(other), "--no-save"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"report.py: {other}, line 2: not a decode.py record (JSON lines from decode.py --out, "
        "or a results file of bench/report.py)"
    )
