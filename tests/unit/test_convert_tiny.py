"""Converting the tiny models: tensors and keys as upstream's loader wants them, and it loads."""

import ctypes

import numpy as np
import pytest
from click.testing import CliRunner
from pyqsa.convert import names as N
from pyqsa.convert.gguf_file import GGUFFile
from pyqsa.convert.inspect import summarize
from safetensors.numpy import load_file

from pyqsa.cli import main


@pytest.fixture(scope="module", params=["tiny", "tiny_ple"])
def converted(request):
    hf = request.getfixturevalue(f"{request.param}_hf_dir")
    return request.param, hf, GGUFFile(request.getfixturevalue(f"{request.param}_gguf"))


def test_tensor_count_and_keys(converted):
    name, _, g = converted
    # upstream writes 207/214 tensors for these models
    assert len(g.tensors) == (214 if name == "tiny_ple" else 207)
    assert g.get("general.architecture") == "qwen4exp"
    assert g.get(N.COMPRESS_RATIOS) == [0, 0, 0, 4, 0, 0, 0, 4]
    assert g.get(N.RECURRENT_LAYERS) == [True] * 3 + [False] + [True] * 3 + [False]
    assert g.get(N.ROPE_DIMENSION_COUNT) == 16  # head_dim 32 * partial_rotary_factor 0.5
    assert g.get(N.ROPE_DIMENSION_SECTIONS) == [3, 3, 2, 0]
    assert g.get(N.SSM_OUTPUT_GATE) == "sigmoid"
    assert g.get(N.PYQSA_QSA_LAYERS) == [3, 7]
    assert g.get(N.PYQSA_QSA_COMPRESS_RATIO) == [4, 4]
    assert g.get(N.PYQSA_QSA_BUDGET) == [16, 16]
    assert len(g.get(N.PYQSA_KV_SCALES_K)) == len(g.get(N.PYQSA_KV_SCALES_V)) == 4
    assert all(x > 0 for x in g.get(N.PYQSA_KV_SCALES_K) + g.get(N.PYQSA_KV_SCALES_V))
    assert g.get(N.PYQSA_KV_SCALES_SOURCE) == "weight-estimate"
    assert g.get(N.PYQSA_CONVERTER_VERSION) == N.CONVERTER_VERSION
    if name == "tiny_ple":
        assert g.get(N.PLE_LAYERS) == [1]
        assert g.get(N.PLE_EOS_TOKEN_ID) == 151645
        assert g.get(N.PLE_HEAD_OFFSETS) == [0, 1009, 2022, 3041]
        assert g.get(N.PLE_EMBEDDING_LENGTH) == 16
    else:
        assert N.PLE_LAYERS not in g.fields


def test_transforms_match_hf(converted):
    name, hf_dir, g = converted
    hf = load_file(str(hf_dir / "model.safetensors"))
    t = {x.name: g.f32(x) for x in g.tensors}
    la, sa = "model.layers.0.linear_attn.", "model.layers.3.self_attn."
    # zero-centred gammas get +1; the GDN gated norm does not
    np.testing.assert_array_equal(t["blk.3.attn_k_norm.weight"], hf[sa + "k_norm.weight"] + 1)
    np.testing.assert_array_equal(t["blk.0.ssm_norm.weight"], hf[la + "norm.weight"])
    np.testing.assert_array_equal(
        t["output_hc_norm.weight"], hf["model.hyper_connection_mixer.hc_norm.weight"] + 1
    )
    qk = hf[sa + "indexer.index_qk_proj.weight"]
    np.testing.assert_array_equal(t["blk.3.indexer.k_proj.weight"], qk[64:])
    # V heads: grouped by K head in HF, tiled in GGUF (nk=2, nv=4, head dim 16)
    z = hf[la + "in_proj_z.weight"].reshape(2, 2, 16, 64).swapaxes(0, 1).reshape(64, 64)
    np.testing.assert_array_equal(t["blk.0.attn_gate.weight"], z)
    a = hf[la + "A_log"].reshape(2, 2).T.ravel()
    # exp's last bit depends on numpy's build and SIMD path: a float64 reference, a 1-ULP bound
    np.testing.assert_array_max_ulp(
        t["blk.0.ssm_a"], -np.exp(a.astype(np.float64)).astype(np.float32), 1
    )
    gate = np.stack([hf[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] for e in range(4)])
    np.testing.assert_array_equal(t["blk.0.ffn_gate_exps.weight"], gate)
    if name == "tiny_ple":
        p = "model.layers.1.ple."
        table = np.concatenate(
            [hf[p + f"ple_embedding.ngram_embedding.shard_{s}.weight"] for s in range(2)]
        )
        np.testing.assert_array_equal(t["per_layer_token_embd.weight"], table)
        np.testing.assert_array_equal(t["blk.1.ple_conv1d.weight"], hf[p + "conv1d.weight"][:, 0])
        assert g.get(N.PLE_LAYER_MULTIPLIERS) == hf[p + "ple_embedding.layer_multipliers"].tolist()


def load_in_runtime(path):
    """llama_model_load_from_file on the file; checks arch and layer count, then frees it."""
    import llama_cpp as L

    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    assert model, "llama_model_load_from_file failed"
    try:
        buf = ctypes.create_string_buffer(64)
        L.llama_model_meta_val_str(model, b"general.architecture", buf, 64)
        assert buf.value == b"qwen4exp"
        assert L.llama_model_n_layer(model) == 8
    finally:
        L.llama_model_free(model)


def test_loads_in_upstream_runtime(converted):
    load_in_runtime(converted[2].path)


def test_inspect_shows_two_qsa_layers(tiny_gguf):
    r = CliRunner().invoke(main, ["inspect", str(tiny_gguf)])
    assert r.exit_code == 0, r.output
    assert "layers:        8 (6 linear attention, 2 QSA)" in r.output
    assert "QSA layers:    3, 7" in r.output
    assert "ratio 4, budget 16 tokens" in r.output
    assert "F32" in r.output and "207" in r.output
    s = summarize(tiny_gguf)
    assert [q.layer for q in s.qsa_layers] == [3, 7]
    assert s.layer_map == "LLLQLLLQ"
    assert s.n_tensors == 207 and s.bytes_by_type["F32"] == s.n_bytes


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
def test_outtypes(tiny_hf_dir, tmp_path, outtype):
    out = tmp_path / f"m-{outtype}.gguf"
    r = CliRunner().invoke(
        main, ["convert", str(tiny_hf_dir), "-o", str(out), "--outtype", outtype, "--quiet"]
    )
    assert r.exit_code == 0, r.output
    g = GGUFFile(out)
    types = {t.name: t.qtype.name for t in g.tensors}
    assert types["blk.3.attn_k_norm.weight"] == "F32"  # norms stay f32
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"  # the router too
    assert types["token_embd.weight"] == outtype.upper()
    # q8_0 needs rows of 32: the hyper-connection up-projection (rank 8) falls back to f16
    assert types["output_hc_up.weight"] == ("F16" if outtype == "q8_0" else outtype.upper())
    emb = g.f32(next(t for t in g.tensors if t.name == "token_embd.weight"))
    ref = load_file(str(tiny_hf_dir / "model.safetensors"))["model.embed_tokens.weight"]
    np.testing.assert_allclose(emb, ref, atol=np.abs(ref).max() / 100)
    load_in_runtime(out)
