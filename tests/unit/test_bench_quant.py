"""bench/quant_run.sh --cpu on the --small synthetic model: pyqsa quantize to Q8_0 and Q4_K_M,
a record per file, decode.py on the source and on each file, the table and the results file;
a second call reuses the files. (llama-quantize is built on the GPU machine only: too long for
CI's two cores.)"""

import json
import os
import subprocess

import pytest
from bench_scripts import BENCH, small_model

SCRIPT = BENCH / "quant_run.sh"
DECODE = ["--contexts", "256", "--seqs", "1,8", "--steps", "2", "--warmup", "1"]
DECODE += ["--decode-args", "--threads 1"]


def quant_run(tmp, model, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp / "out"), "PYQSA_BENCH_WORK": str(tmp / "work")}
    cmd = ["bash", str(SCRIPT), "--cpu", "--model", str(model), "--tools", "pyqsa", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def first_call(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quant")
    model = small_model(tmp / "small.gguf")
    proc = quant_run(tmp, model, "--types", "Q8_0,Q4_K_M", *DECODE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, model, proc


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_per_quantized_file(first_call):
    tmp, model, _ = first_call
    quant = records(tmp / "out" / "quant.jsonl")
    assert [(q["tool"], q["type"]) for q in quant] == [("pyqsa", "Q8_0"), ("pyqsa", "Q4_K_M")]
    for q in quant:
        assert q["source"] == model.name and q["source_bytes"] == model.stat().st_size
        assert q["model"] == f"small-pyqsa-{q['type']}.gguf" and q["seconds"] > 0
        assert q["model_bytes"] == (tmp / "work" / "quant" / q["model"]).stat().st_size
        assert q["model_bytes"] < q["source_bytes"] / 1.5
        assert sum(q["bytes_by_type"].values()) < q["model_bytes"]  # the rest is metadata
        assert "commit" in q and "upstream_commit" in q
    assert quant[0]["bytes_by_type"]["Q8_0"] > 0
    assert quant[1]["model_bytes"] < quant[0]["model_bytes"]


def test_decode_runs_on_every_file(first_call):
    tmp, model, _ = first_call
    dec = records(tmp / "out" / "decode.jsonl")
    names = [model.name, "small-pyqsa-Q8_0.gguf", "small-pyqsa-Q4_K_M.gguf"]
    got = [(r["model"], r["kind"], r.get("n_seq")) for r in dec]
    runs = (("prefill", None), ("decode", 1), ("decode", 8))
    assert got == [(n, kind, n_seq) for n in names for kind, n_seq in runs]
    assert all(r["variant"] == "pyqsa" and r["context"] == 256 for r in dec)


def test_table_and_results_file(first_call):
    tmp, _, proc = first_call
    out = tmp / "out"
    table = (out / "quant-report.md").read_text().splitlines()
    assert table[0].startswith("| file | tool | type | variant | GiB | quantize s | prefill 256 |")
    assert [line.split(" | ")[1:4] for line in table[2:]] == [
        ["-", "f16", "pyqsa"],
        ["pyqsa", "Q8_0", "pyqsa"],
        ["pyqsa", "Q4_K_M", "pyqsa"],
    ]
    (saved,) = out.glob("*-quant.json")
    doc = json.loads(saved.read_text())
    assert doc["scenario"] == "quant" and len(doc["rows"]) == 3
    assert all(r["decode_tok_s"]["256x8"] > 0 for r in doc["rows"])
    assert "run: small-pyqsa-Q4_K_M.gguf at 256" in proc.stdout


def test_each_variant_runs_and_has_its_row(first_call):
    tmp, model, _ = first_call
    out = tmp / "variants"
    env_out = {**os.environ, "OUT": str(out), "PYQSA_BENCH_WORK": str(tmp / "work")}
    cmd = ["bash", str(SCRIPT), "--cpu", "--model", str(model), "--tools", "pyqsa"]
    cmd += ["--types", "Q8_0", "--no-f16", "--variants", "pyqsa,quantup"]
    cmd += ["--contexts", "256", "--seqs", "1"]
    cmd += ["--steps", "2", "--warmup", "1", "--decode-args", "--threads 1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_out, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    variants = [r["variant"] for r in records(out / "decode.jsonl") if r["kind"] == "decode"]
    assert variants == ["pyqsa", "pyqsa-gemvup-hcmixunf"]
    table = (out / "quant-report.md").read_text().splitlines()[2:]
    # the source (--no-f16: no runs) then the file under each variant
    assert [line.split(" | ")[3] for line in table] == ["-", "pyqsa", "pyqsa-gemvup-hcmixunf"]
    commands = (out / "commands.txt").read_text()
    switches = "PYQSA_CUDA_GEMV_UPSTREAM=1 PYQSA_HC_MIX_UNFUSED=1"
    assert f"env {switches} python3 bench/decode.py" in commands


def test_a_second_call_reuses_the_files(first_call):
    tmp, model, _ = first_call
    before = (tmp / "work" / "quant" / "small-pyqsa-Q8_0.gguf").stat().st_mtime_ns
    proc = quant_run(tmp, model, "--types", "Q8_0", "--contexts", "", "--no-f16")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "quantize:" not in proc.stdout
    assert (tmp / "work" / "quant" / "small-pyqsa-Q8_0.gguf").stat().st_mtime_ns == before
    assert records(tmp / "out" / "quant.jsonl")[-1]["seconds"] is None


def test_bad_options(tmp_path):
    proc = quant_run(tmp_path, tmp_path / "none.gguf", "--tools", "nope")
    assert proc.returncode == 2 and "unknown tool nope" in proc.stderr
    proc = quant_run(tmp_path, tmp_path / "none.gguf", "--variants", "pyqsa,nope")
    assert proc.returncode == 2 and "unknown variant nope" in proc.stderr
    proc = quant_run(tmp_path, tmp_path / "none.gguf", "--frobnicate", "1")
    assert proc.returncode == 2 and "unknown option --frobnicate" in proc.stderr
    proc = quant_run(tmp_path, tmp_path / "none.gguf", "--llama-quantize", str(tmp_path / "no"))
    assert proc.returncode == 2 and "--llama-quantize" in proc.stderr and "no such" in proc.stderr


def test_report_cells_give_median_and_range_of_the_repeats(tmp_path):
    quant = {"source": "f16.gguf", "source_bytes": 2**30, "model": "q4.gguf", "model_bytes": 2**29}
    quant |= {"tool": "pyqsa", "type": "Q4_K_M", "seconds": 3.0}
    decode = [
        {"model": "q4.gguf", "kind": "decode", "context": 32768, "n_seq": 8, "tok_s": v}
        for v in (500.0, 520.0, 490.0)
    ]
    decode.append({**decode[0], "model": "f16.gguf", "tok_s": 400.0})
    (tmp_path / "q.jsonl").write_text(json.dumps(quant) + "\n")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in decode))
    cmd = ["python", str(BENCH / "quant_report.py"), str(tmp_path / "q.jsonl")]
    proc = subprocess.run([*cmd, str(tmp_path / "d.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0][2:]: line for line in proc.stdout.splitlines()[2:]}
    assert rows["q4.gguf"].endswith("| 500.0 (490.0-520.0) |")
    assert rows["f16.gguf"].endswith("| 400.0 |")  # one run: no range


def test_report_keeps_the_quantize_time_of_an_earlier_call(tmp_path):
    first = {"source": "f16.gguf", "source_bytes": 2**30, "model": "q4.gguf", "model_bytes": 2**29}
    first |= {"tool": "pyqsa", "type": "Q4_K_M", "seconds": 42.5}
    again = {**first, "seconds": None}  # a second call reused the file
    (tmp_path / "q.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(again) + "\n")
    (tmp_path / "d.jsonl").write_text("")
    cmd = ["python", str(BENCH / "quant_report.py"), str(tmp_path / "q.jsonl")]
    proc = subprocess.run(
        [*cmd, str(tmp_path / "d.jsonl"), "--save", str(tmp_path)], text=True, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(next(tmp_path.glob("*-quant.json")).read_text())
    assert [r["quantize_s"] for r in doc["rows"] if r["model"] == "q4.gguf"] == [42.5]
