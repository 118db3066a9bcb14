"""Every bad input: a one-line message, exit code 2, and no output or temp file left behind."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from pyqsa.convert import writer
from safetensors.numpy import load_file, save_file

from pyqsa.cli import main

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def tiny_tensors(tiny_hf_dir):
    return load_file(str(tiny_hf_dir / "model.safetensors"))


def variant(tiny_hf_dir: Path, dest: Path, config=None, tensors=None) -> Path:
    """A copy of the tiny checkpoint (linked files) with config and/or tensors changed."""
    dest.mkdir()
    cfg = json.loads((tiny_hf_dir / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config(cfg) if config else cfg))
    for f in TOKENIZER_FILES:
        os.symlink(tiny_hf_dir / f, dest / f)
    if tensors is None:
        os.symlink(tiny_hf_dir / "model.safetensors", dest / "model.safetensors")
    else:
        save_file(tensors, str(dest / "model.safetensors"))
    return dest


def run_convert(args, out_dir: Path):
    before = set(os.listdir(out_dir))
    r = CliRunner().invoke(main, ["convert", *map(str, args), "--quiet"])
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyqsa: error: "), r.stderr
    assert set(os.listdir(out_dir)) == before, "an output or temp file was left behind"
    return lines[0]


def set_key(key, value):
    def edit(cfg):
        cfg[key] = value
        return cfg

    return edit


def drop_key(key):
    def edit(cfg):
        del cfg[key]
        return cfg

    return edit


CONFIG_CASES = {
    "architecture": (
        lambda c: {**c, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
        "unsupported architecture LlamaForCausalLM",
    ),
    "indexer_kv_heads": (set_key("indexer_kv_heads", 2), "indexer_kv_heads must be 1, got 2"),
    "budget_ratio": (
        set_key("indexer_budget", 18),
        "indexer_budget 18 is not divisible by indexer_compress_ratio 4",
    ),
    "missing_qsa": (drop_key("indexer_budget"), "missing QSA fields indexer_budget"),
    "output_gate": (set_key("output_gate_type", "gelu"), "output gate 'gelu' is not supported"),
    "layer_types": (
        set_key("layer_types", ["linear_attention"] * 7),
        "layer_types has 7 entries, num_hidden_layers is 8",
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config(tiny_hf_dir, tmp_path, case):
    edit, message = CONFIG_CASES[case]
    hf = variant(tiny_hf_dir, tmp_path / "hf", config=edit)
    out = tmp_path / "out"
    out.mkdir()
    assert message in run_convert([hf, "-o", out / "m.gguf"], out)


def test_missing_tensor(tiny_hf_dir, tiny_tensors, tmp_path):
    t = {k: v for k, v in tiny_tensors.items() if k != "model.layers.3.self_attn.k_norm.weight"}
    hf = variant(tiny_hf_dir, tmp_path / "hf", tensors=t)
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "checkpoint is missing 1 tensor(s): model.layers.3.self_attn.k_norm.weight" in msg


def test_extra_tensor(tiny_hf_dir, tiny_tensors, tmp_path):
    t = {**tiny_tensors, "model.layers.0.mystery.weight": np.zeros(4, np.float32)}
    hf = variant(tiny_hf_dir, tmp_path / "hf", tensors=t)
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "checkpoint has 1 unexpected tensor(s): model.layers.0.mystery.weight" in msg


def test_wrong_shape(tiny_hf_dir, tiny_tensors, tmp_path):
    t = {**tiny_tensors, "model.layers.0.linear_attn.in_proj_z.weight": np.zeros((64, 32))}
    hf = variant(
        tiny_hf_dir, tmp_path / "hf", tensors={k: v.astype(np.float32) for k, v in t.items()}
    )
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert (
        "model.layers.0.linear_attn.in_proj_z.weight has shape [64, 32], expected [64, 64]" in msg
    )


def test_truncated_safetensors(tiny_hf_dir, tmp_path):
    hf = variant(tiny_hf_dir, tmp_path / "hf", tensors={})
    (hf / "model.safetensors").unlink()
    data = (tiny_hf_dir / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes(data[: len(data) // 2])
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "corrupt safetensors file" in msg and "truncated" in msg


def test_garbage_safetensors(tiny_hf_dir, tmp_path):
    hf = variant(tiny_hf_dir, tmp_path / "hf", tensors={})
    (hf / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "corrupt safetensors file (header is not JSON)" in msg


def test_unreadable_safetensors(tiny_hf_dir, tmp_path):
    hf = variant(tiny_hf_dir, tmp_path / "hf", tensors={})
    (hf / "model.safetensors").unlink()
    (hf / "model.safetensors").mkdir()  # unreadable even for root, unlike chmod 000
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "unreadable safetensors file" in msg


def test_missing_shard(tiny_hf_dir, tmp_path):
    hf = variant(tiny_hf_dir, tmp_path / "hf")
    index = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = run_convert([hf, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "shard model-00002-of-00002.safetensors is missing" in msg


def test_output_folder_missing(tiny_hf_dir, tmp_path):
    msg = run_convert([tiny_hf_dir, "-o", tmp_path / "nope" / "m.gguf"], tmp_path)
    assert "nope does not exist" in msg


def test_output_not_writable(tiny_hf_dir, tmp_path):
    (tmp_path / "file").write_text("x")
    msg = run_convert([tiny_hf_dir, "-o", tmp_path / "file" / "m.gguf"], tmp_path)
    assert "cannot write" in msg and "file is not a folder" in msg


def test_calibration_text_missing(tiny_hf_dir, tmp_path):
    msg = run_convert(
        [tiny_hf_dir, "-o", tmp_path / "m.gguf", "--calibrate", tmp_path / "none.txt"], tmp_path
    )
    assert "unreadable calibration text" in msg


def test_refresh_with_outtype(tiny_gguf, tmp_path):
    msg = run_convert([tiny_gguf, "--refresh-qsa", "--outtype", "f16"], tmp_path)
    assert "--outtype does not apply to --refresh-qsa" in msg


def test_output_is_directory(tiny_hf_dir, tmp_path):
    (tmp_path / "m.gguf").mkdir()
    msg = run_convert([tiny_hf_dir, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "it is a directory" in msg


def test_not_enough_disk(tiny_hf_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1, 1, 1))
    msg = run_convert([tiny_hf_dir, "-o", tmp_path / "m.gguf"], tmp_path)
    assert "not enough disk space" in msg and "GiB free" in msg


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_interrupted_write_leaves_nothing(tiny_hf_dir, tmp_path, monkeypatch, exc):
    """Ctrl-C or a failing disk halfway through: neither the output nor the temp file stays."""
    calls = []
    real = writer.gguf.quants.quantize

    def flaky(data, qtype):
        calls.append(1)
        if len(calls) == 50:
            raise exc
        return real(data, qtype)

    monkeypatch.setattr(writer.gguf.quants, "quantize", flaky)
    existing = tmp_path / "m.gguf"
    existing.write_bytes(b"old")  # an earlier output survives a failed overwrite
    r = CliRunner().invoke(main, ["convert", str(tiny_hf_dir), "-o", str(existing), "--quiet"])
    assert len(calls) == 50
    if exc is KeyboardInterrupt:
        assert r.exit_code != 0
    else:
        assert r.exit_code == 2 and "No space left on device" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"] and existing.read_bytes() == b"old"


def test_refresh_refuses_upstream_zero_ratios(tiny_gguf, tmp_path):
    """A file with QSA switched off (ratio 0 on indexed layers) is refused, not 'refreshed'."""
    from pyqsa.convert import names as N
    from pyqsa.convert.gguf_file import GGUFFile
    from pyqsa.convert.pipeline import Item
    from pyqsa.convert.writer import write_gguf

    g = GGUFFile(tiny_gguf)
    kvs = [
        (k, [0] * 8 if k == N.COMPRESS_RATIOS else f.value, f.type, f.sub_type)
        for k, f in g.fields.items()
        if k != "general.architecture"
    ]
    items = [Item(t.name, t.shape, t.qtype, lambda t=t: iter([g.raw(t)])) for t in g.tensors]
    path = tmp_path / "zero.gguf"
    write_gguf(path, kvs, items, progress=False)
    data = path.read_bytes()
    msg = run_convert([path, "--refresh-qsa"], tmp_path)
    assert "compress ratio is 0 on indexed layers [3, 7]" in msg
    assert path.read_bytes() == data
    # inspect still describes such a file, and says what is wrong with it
    r = CliRunner().invoke(main, ["inspect", str(path)])
    assert r.exit_code == 0 and r.output.count("ratio 0: QSA OFF (dense attention") == 2
    assert "pyqsa.qsa.* keys disagree with the qwen4exp keys" in r.output


def test_refresh_not_a_gguf(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    msg = run_convert([tmp_path / "x.gguf", "--refresh-qsa"], tmp_path)
    assert "not a valid GGUF file" in msg


def test_inspect_missing_file(tmp_path):
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "none.gguf")])
    assert r.exit_code == 2 and "not found" in r.stderr


def test_ctrl_c_in_a_real_process(tiny_hf_dir, tmp_path):
    """SIGINT while the file is being written: the process fails and leaves nothing behind.

    The signal races with the end of the write (the temp file is seen, then the signal is
    sent), so a run that finished first must have left a complete file and exit 0, and the
    race is run again until one interrupt lands inside the write.
    """
    import signal
    import subprocess
    import sys
    import time

    from pyqsa.convert.gguf_file import GGUFFile

    out = tmp_path / "m.gguf"
    # q8_0 quantizes in numpy for a few seconds: a wide window to interrupt the write
    cmd = [sys.executable, "-m", "pyqsa.cli", "convert", str(tiny_hf_dir), "-o", str(out)]
    cmd += ["--outtype", "q8_0", "--quiet"]
    finished_first = 0
    for _ in range(5):
        # SIGINT as a terminal's, even when the test run inherited it ignored (run in the
        # background), which Python would keep
        proc = subprocess.Popen(
            cmd,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 60
        while not any(p.suffix == ".tmp" for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "no temp file appeared"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        if rc != 0:
            assert list(tmp_path.iterdir()) == []
            return
        # the write completed before the signal: the whole file, and no temp file
        assert list(tmp_path.iterdir()) == [out]
        assert len(GGUFFile(out).tensors) > 0
        out.unlink()
        finished_first += 1
    raise AssertionError(f"all {finished_first} runs finished before the signal")
