"""write_model, bf16/sharded checkpoints, the text part of ConditionalGeneration, and the
pyqsa.* keys: calibration, weight estimate and --refresh-qsa."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from pyqsa.convert import ConvertError, qwen_vocab_gguf, refresh_qsa, write_model
from pyqsa.convert import names as N
from pyqsa.convert.gguf_file import GGUFFile
from pyqsa.convert.hf_config import parse_config
from safetensors.numpy import load_file

from pyqsa.cli import main

CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸 🦊 x = f(y)\n" * 12


@pytest.fixture(scope="module")
def tiny_config(tiny_hf_dir):
    return json.loads((tiny_hf_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def tiny_tensors(tiny_hf_dir):
    return load_file(str(tiny_hf_dir / "model.safetensors"))


def tensors_of(path):
    g = GGUFFile(path)
    return {t.name: g.f32(t) for t in g.tensors}


def test_write_model_from_numpy_with_vocab_gguf(tiny_config, tiny_tensors, tiny_gguf, tmp_path):
    out = write_model(
        tiny_config, iter(tiny_tensors.items()), qwen_vocab_gguf(), tmp_path / "demo.gguf"
    )
    g = GGUFFile(out)
    assert g.get("tokenizer.ggml.pre") == "qwen35"
    assert len(g.get("tokenizer.ggml.tokens")) == 151936
    assert g.get("tokenizer.ggml.bos_token_id") == 151643
    ours, ref = tensors_of(out), tensors_of(tiny_gguf)
    assert ours.keys() == ref.keys()
    assert all(np.array_equal(ours[k], ref[k]) for k in ref)
    assert os.listdir(tmp_path) == ["demo.gguf"]


def test_write_model_rejects_bad_outtype(tiny_config, tiny_tensors, tmp_path):
    with pytest.raises(ConvertError, match="unknown outtype 'q4_0'"):
        write_model(tiny_config, tiny_tensors, qwen_vocab_gguf(), tmp_path / "x.gguf", "q4_0")


def test_bf16_sharded_checkpoint(tiny_hf_dir, tiny_tensors, tiny_gguf, tmp_path):
    """bf16 safetensors in two shards convert without torch: the bits are widened exactly."""
    import torch
    from safetensors.torch import save_file as save_torch

    hf = tmp_path / "hf"
    hf.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        os.symlink(tiny_hf_dir / f, hf / f)
    names = sorted(tiny_tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    bf16 = {}
    for fname, part in shards.items():
        t = {n: torch.from_numpy(tiny_tensors[n]) for n in part}
        t = {n: v.to(torch.bfloat16) if v.is_floating_point() else v for n, v in t.items()}
        bf16.update(t)
        save_torch(t, str(hf / fname))
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    r = CliRunner().invoke(main, ["convert", str(hf), "-o", str(tmp_path / "b.gguf"), "--quiet"])
    assert r.exit_code == 0, r.output
    ours = tensors_of(tmp_path / "b.gguf")
    emb = bf16["model.embed_tokens.weight"].float().numpy()
    np.testing.assert_array_equal(ours["token_embd.weight"], emb)
    assert ours.keys() == tensors_of(tiny_gguf).keys()


def test_conditional_generation_text_part(tiny_config, tiny_tensors, tiny_gguf, tmp_path):
    """Qwen4ExpForConditionalGeneration: nested text_config, model.language_model.* names,
    vision and MTP tensors dropped."""
    text = {k: v for k, v in tiny_config.items() if k not in ("architectures", "model_type")}
    config = {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "text_config": {**text, "model_type": "qwen4_exp_text"},
        "vision_config": {"depth": 2},
        "image_token_id": 151655,
    }
    tensors = {
        (n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n): v
        for n, v in tiny_tensors.items()
    }
    tensors["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((6, 2), np.float32)
    tensors["mtp.fc.weight"] = np.zeros((2, 2), np.float32)
    assert parse_config(config).architecture == "Qwen4ExpForConditionalGeneration"
    out = write_model(config, tensors, qwen_vocab_gguf(), tmp_path / "cg.gguf")
    ours, ref = tensors_of(out), tensors_of(tiny_gguf)
    assert ours.keys() == ref.keys()
    assert all(np.array_equal(ours[k], ref[k]) for k in ref)


def test_config_defaults_like_hf():
    """HF's defaults: layer_types from the interval, partial_rotary_factor 1.0, gate silu."""
    cfg = parse_config(
        {
            "architectures": ["Qwen4ExpForCausalLM"],
            "num_hidden_layers": 8,
            "head_dim": 64,
            "indexer_n_heads": 2,
            "indexer_kv_heads": 1,
            "indexer_head_dim": 64,
            "indexer_budget": 32,
            "indexer_compress_ratio": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        }
    )
    assert cfg.qsa_layers == [3, 7]
    assert cfg.rope_dim == 64
    assert cfg.output_gate == "silu"
    assert cfg.compress_ratios == [0, 0, 0, 4, 0, 0, 0, 4]
    # the checkpoint's name of a QSA layer, and the one some transformers releases save
    full = parse_config(
        {
            "architectures": ["Qwen4ExpForCausalLM"],
            "num_hidden_layers": 3,
            "layer_types": ["linear_attention", "full_attention", "qwen_sparse_attention"],
            **{
                k: 4 if k != "indexer_kv_heads" else 1
                for k in (
                    "indexer_n_heads",
                    "indexer_kv_heads",
                    "indexer_head_dim",
                    "indexer_budget",
                    "indexer_compress_ratio",
                )
            },
            "head_dim": 4,
        }
    )
    assert full.qsa_layers == [1, 2]  # both mean indexed_attention


def test_calibrate_on_convert_then_refresh(tiny_ple_hf_dir, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text(CALIBRATION_TEXT)
    out = tmp_path / "c.gguf"
    r = CliRunner().invoke(
        main, ["convert", str(tiny_ple_hf_dir), "-o", str(out), "--calibrate", str(text), "--quiet"]
    )
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path)) == ["c.gguf", "calib.txt"]
    g = GGUFFile(out)
    assert g.get(N.PYQSA_KV_SCALES_SOURCE).startswith("calibrated:")
    n_tok = int(g.get(N.PYQSA_KV_SCALES_SOURCE).split(":")[1].split()[0])
    assert n_tok > 100
    ks, vs = g.get(N.PYQSA_KV_SCALES_K), g.get(N.PYQSA_KV_SCALES_V)
    assert len(ks) == len(vs) == 4 and min(ks + vs) > 0
    before = {t.name: g.raw(t).tobytes() for t in g.tensors}
    # refresh back to the weight estimate: only the pyqsa keys change
    scales = refresh_qsa(out, progress=False)
    g2 = GGUFFile(out)
    assert g2.get(N.PYQSA_KV_SCALES_SOURCE) == "weight-estimate"
    assert list(scales.k) == pytest.approx(g2.get(N.PYQSA_KV_SCALES_K))
    assert {t.name: g2.raw(t).tobytes() for t in g2.tensors} == before
    assert {k: f.value for k, f in g2.fields.items() if k not in N.PYQSA_KEYS} == {
        k: f.value for k, f in g.fields.items() if k not in N.PYQSA_KEYS
    }
    # the estimate bounds what calibration saw (it is meant to be conservative)
    assert all(e >= c for e, c in zip(g2.get(N.PYQSA_KV_SCALES_K), ks, strict=True))
    assert all(e >= c for e, c in zip(g2.get(N.PYQSA_KV_SCALES_V), vs, strict=True))


def test_refresh_cli_with_calibration(tiny_gguf, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text(CALIBRATION_TEXT)
    out = tmp_path / "r.gguf"
    r = CliRunner().invoke(
        main,
        ["convert", str(tiny_gguf), "--refresh-qsa", "--calibrate", str(text), "-o", str(out)],
    )
    assert r.exit_code == 0, r.output
    assert "calibrated:" in r.output
    assert GGUFFile(out).get(N.PYQSA_KV_SCALES_SOURCE).startswith("calibrated:")
    assert GGUFFile(tiny_gguf).get(N.PYQSA_KV_SCALES_SOURCE) == "weight-estimate"
    s = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    info = json.loads(s.output)
    assert [q["layer"] for q in info["qsa_layers"]] == [3, 7]
    assert info["kv_scales_source"].startswith("calibrated:")


def test_synthetic_weights_match_hf_layout(tiny_ple_hf_dir, tmp_path):
    """random_tensors: HF's names, shapes and PLE hash constants; the result converts and runs."""
    import llama_cpp as L
    from pyqsa.convert import hf_tensor_shapes, random_tensors

    config = json.loads((tiny_ple_hf_dir / "config.json").read_text())
    hf = load_file(str(tiny_ple_hf_dir / "model.safetensors"))
    shapes = hf_tensor_shapes(config)
    table = "model.layers.1.ple.ple_embedding.ngram_embedding"
    assert shapes.pop(table + ".weight") == (4096, 16)  # = the two saved shards
    assert shapes == {n: v.shape for n, v in hf.items() if not n.startswith(table)}
    t = random_tensors(config, seed=3)
    for c in ("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes"):
        name = f"model.layers.1.ple.ple_embedding.{c}"
        np.testing.assert_array_equal(t[name], hf[name])
    out = write_model(config, t, qwen_vocab_gguf(), tmp_path / "rand.gguf")
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(out).encode(), L.llama_model_default_params())
    assert model
    ctx = L.llama_init_from_model(model, L.llama_context_default_params())
    try:
        toks = (L.llama_token * 8)(*range(100, 108))
        assert L.llama_decode(ctx, L.llama_batch_get_one(toks, 8)) == 0
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(151936,))
        assert np.isfinite(logits).all() and logits.std() > 0
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)
