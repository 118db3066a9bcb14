"""`pyqsa quantize` on the tiny PLE model: the per-tensor policy, the keys kept, bad input."""

import re
import shutil
from collections import namedtuple

import gguf
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from pyqsa.convert import ConvertError
from pyqsa.convert import quantize as qz
from pyqsa.convert.gguf_file import GGUFFile
from pyqsa.convert.quantize import LLAMA_KEEPS, POLICY, quantize

from pyqsa.cli import main

# f32 in the f32 source's output: kept by llama.cpp at their input type (norms, router, conv,
# indexer projections) and POLICY's f32 ones
KEPT = [*LLAMA_KEEPS, *(p for p, (ty, _) in POLICY.items() if ty == Q.F32)]
GATES = next(p for p in POLICY if "alpha" in p)


def types(path) -> dict[str, Q]:
    r = gguf.GGUFReader(path)
    return {t.name: Q(t.tensor_type) for t in r.tensors}


def pyqsa_keys(path) -> dict[str, object]:
    g = GGUFFile(path)
    return {k: g.get(k) for k in g.fields if k.startswith("pyqsa.")}


@pytest.fixture(scope="module")
def q4(tiny_ple_gguf, tmp_path_factory):
    return quantize(
        tiny_ple_gguf, tmp_path_factory.mktemp("q") / "q4_0.gguf", "Q4_0", progress=False
    )


def test_policy_keeps_qsa_tensors_f32(q4):
    got = types(q4)
    kept = {n for n in got if any(re.search(p, n) for p in KEPT)}
    assert {n for n in kept if "indexer" in n} and {n for n in kept if "ple_conv1d" in n}
    assert {n: got[n].name for n in kept if got[n] != Q.F32} == {}
    # the GDN gates at Q8_0 under a 4-bit type
    gates = {n: t for n, t in got.items() if re.search(GATES, n)}
    assert len(gates) >= 2 and set(gates.values()) == {Q.Q8_0}
    # the rest really was quantized, the hyper-connection mixers too (read by every step)
    assert sum(t == Q.Q4_0 for t in got.values()) > 50
    assert got["blk.0.hc_attn_down.weight"] == Q.Q4_0
    assert not {n for n, t in got.items() if "hc_" in n and "norm" not in n and t == Q.F32}


def test_without_policy_the_gates_are_quantized(tiny_ple_gguf, tmp_path):
    got = types(quantize(tiny_ple_gguf, tmp_path / "o.gguf", "Q4_0", policy=False, progress=False))
    assert got["blk.0.ssm_alpha.weight"] == Q.Q4_0


def test_at_q8_0_the_policy_changes_only_the_ple_conv(tiny_ple_gguf, tmp_path):
    """Under Q8_0 the gates' Q8_0 is llama.cpp's own choice: pyqsa's file differs from
    llama-quantize's only in the PLE conv it keeps f32 (so both decode alike on the GPU)."""
    ours = types(quantize(tiny_ple_gguf, tmp_path / "a.gguf", "Q8_0", progress=False))
    own = types(quantize(tiny_ple_gguf, tmp_path / "b.gguf", "Q8_0", policy=False, progress=False))
    assert ours.keys() == own.keys()
    differ = {n: (ours[n].name, own[n].name) for n in ours if ours[n] != own[n]}
    assert differ and all("ple_conv1d" in n and t[0] == "F32" for n, t in differ.items()), differ
    assert {ours[n] for n in ours if re.search(GATES, n)} == {Q.Q8_0}


def test_pyqsa_keys_survive(tiny_ple_gguf, q4):
    before = pyqsa_keys(tiny_ple_gguf)
    assert "pyqsa.kv_scales.k" in before and "pyqsa.qsa.layers" in before
    assert pyqsa_keys(q4) == before
    assert GGUFFile(q4).get("general.file_type") == qz.TYPES["Q4_0"].ftype


def test_cli_writes_the_file(tiny_ple_gguf, tmp_path):
    out = tmp_path / "o.gguf"
    r = CliRunner().invoke(main, ["quantize", str(tiny_ple_gguf), str(out), "q8_0", "--quiet"])
    assert r.exit_code == 0, r.output
    assert Q.Q8_0 in types(out).values()
    assert [p.name for p in tmp_path.iterdir()] == ["o.gguf"]  # no temp file left


@pytest.mark.parametrize("qtype", ["Q9_K", "f16", ""])
def test_wrong_type_is_one_line(tiny_ple_gguf, tmp_path, qtype):
    with pytest.raises(ConvertError, match="unknown quantization type"):
        quantize(tiny_ple_gguf, tmp_path / "o.gguf", qtype)
    r = CliRunner().invoke(main, ["quantize", str(tiny_ple_gguf), str(tmp_path / "o"), qtype])
    assert r.exit_code == 2 and "TYPE" in r.output


def test_missing_and_foreign_inputs(tmp_path):
    from pyqsa.convert import qwen_vocab_gguf

    r = CliRunner().invoke(
        main, ["quantize", str(tmp_path / "no.gguf"), str(tmp_path / "o"), "Q8_0"]
    )
    assert r.exit_code == 2 and r.output.strip().endswith("no.gguf: not found")
    with pytest.raises(ConvertError, match="architecture 'qwen2', pyqsa quantizes qwen4exp"):
        quantize(qwen_vocab_gguf(), tmp_path / "o.gguf", "Q8_0")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 8)
    with pytest.raises(ConvertError, match="not a valid GGUF"):
        quantize(tmp_path / "junk.gguf", tmp_path / "o.gguf", "Q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.gguf"]


Usage = namedtuple("Usage", "total used free")


def test_full_disk_before_writing(tiny_ple_gguf, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(ConvertError, match=r"not enough disk space .* need up to 0\.\d+ GiB"):
        quantize(tiny_ple_gguf, tmp_path / "o.gguf", "Q8_0")


def test_full_disk_while_writing(tiny_ple_gguf, tmp_path, monkeypatch):
    # the library's write fails (its temp file cannot be opened), and by then the disk is full
    monkeypatch.setattr(qz, "temp_path", lambda out: tmp_path / "gone" / "o.tmp")
    free = iter([1 << 40, 0])
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 0, next(free)))
    with pytest.raises(ConvertError, match=r"writing .*o\.gguf failed: no space left on device"):
        quantize(tiny_ple_gguf, tmp_path / "o.gguf", "Q8_0", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_library_failure_is_one_line(tiny_ple_gguf, tmp_path, monkeypatch):
    monkeypatch.setattr(qz, "temp_path", lambda out: tmp_path / "gone" / "o.tmp")
    with pytest.raises(ConvertError, match=r"quantizing to .*o\.gguf failed: \S") as e:
        quantize(tiny_ple_gguf, tmp_path / "o.gguf", "Q8_0", progress=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K_M", "IQ4_XS"])
def test_size_bound_covers_the_output(tiny_ple_gguf, tmp_path, kind):
    """The bound the disk check asks for holds every type's output, and is well under the f32
    source's size (a full-size source's Q4_K_M must not need the source's size free)."""
    bound = qz.size_bound(GGUFFile(tiny_ple_gguf))
    out = quantize(tiny_ple_gguf, tmp_path / "o.gguf", kind, progress=False)
    assert out.stat().st_size <= bound + (16 << 20)
    assert bound < 0.5 * tiny_ple_gguf.stat().st_size


def test_inspect_shows_types_and_serve_memory(q4):
    import json

    r = CliRunner().invoke(main, ["inspect", str(q4), "--slots", "8", "--ctx", "4096", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    m = s["serve_memory"]
    # 2 QSA layers x K and V x 2 KV heads x 32 dims x 2 bytes (f16) = 512 bytes a token
    assert m["kv"] == 512 * 8 * 4096
    # the hot cache: 2 x (budget 16 / ratio 4) blocks of 4 tokens a slot
    assert (m["hot_blocks"], m["hot"]) == (8, 512 * 8 * 8 * 4)
    assert m["weights"] == sum(s["bytes_by_type"].values()) and s["bytes_by_type"]["Q4_0"] > 0
    assert m["device_unpaged"] == m["weights"] + m["kv"]
    assert m["device_paged"] == m["weights"] + m["hot"]
    text = CliRunner().invoke(main, ["inspect", str(q4), "--ctx", "262144"]).output
    assert "Q4_0" in text and "unpaged: " in text and "paged: " in text


def test_convert_outtype_quantizes(tiny_ple_hf_dir, tmp_path):
    out = tmp_path / "m.gguf"
    args = ["convert", str(tiny_ple_hf_dir), "-o", str(out), "--outtype", "Q4_K_M", "--quiet"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    g = GGUFFile(out)
    assert g.get("general.file_type") == qz.TYPES["Q4_K_M"].ftype
    assert g.get("pyqsa.qsa.layers") == [3, 7]
    got = types(out)
    # rows of 64: Q4_K falls back to Q5_0; the indexer projections stay f32
    assert got["blk.3.attn_q.weight"] == Q.Q5_0 and got["blk.3.indexer.q_proj.weight"] == Q.F32
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # the f32 staging file is gone
