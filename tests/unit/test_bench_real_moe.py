"""bench/synth_model.py --real-moe on CPU: the --small model with the real routing (512 experts,
top-10) and the real vocab_size (248320, the tokenizer's list padded with UNUSED entries), its
metadata, tokenization, and a short decode through decode.py; the full-shape layer count and
file size, from the config alone."""

import sys

import pytest
from bench_scripts import BENCH, decode_records, run
from pyqsa.convert.gguf_file import GGUFFile

sys.path.insert(0, str(BENCH))
import synth_model  # noqa: E402


@pytest.fixture(scope="module")
def real_moe_gguf(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "small-realmoe.gguf"
    proc = run(str(BENCH / "synth_model.py"), str(out), "--small", "--real-moe", "--threads", "2")
    assert "8 layers (2 QSA), 512 experts top-10, vocab 248320 (248320 tokens)" in proc.stdout
    return out


def test_real_moe_metadata(real_moe_gguf):
    g = GGUFFile(real_moe_gguf)
    assert g.get("general.name") == "flash-next-synthetic-realmoe"
    assert g.get("qwen4exp.expert_count") == 512
    assert g.get("qwen4exp.expert_used_count") == 10
    assert g.get("qwen4exp.block_count") == 8
    assert g.get("qwen4exp.attention.compress_ratios") == [0, 0, 0, 4] * 2  # every 4th QSA
    t = {t.name: t for t in g.tensors}
    assert t["token_embd.weight"].shape == t["output.weight"].shape == (248320, 128)
    assert t["blk.0.ffn_gate_exps.weight"].shape == (512, 64, 128)
    assert t["blk.0.ffn_down_exps.weight"].shape == (512, 128, 64)
    assert t["blk.0.ffn_gate_inp.weight"].shape == (512, 128)
    # the vocab file's tokenizer, its list padded: same tokens, types, merges and specials
    v = GGUFFile(synth_model.converter().qwen_vocab_gguf())
    tokens, vtokens = g.get("tokenizer.ggml.tokens"), v.get("tokenizer.ggml.tokens")
    assert len(vtokens) < len(tokens) == 248320
    n = len(vtokens)
    assert tokens[:n] == vtokens
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, 248320)]
    types = g.get("tokenizer.ggml.token_type")
    assert types[:n] == v.get("tokenizer.ggml.token_type") and set(types[n:]) == {5}  # UNUSED
    assert g.get("tokenizer.ggml.merges") == v.get("tokenizer.ggml.merges")
    assert g.get("tokenizer.ggml.eos_token_id") == v.get("tokenizer.ggml.eos_token_id")


def test_real_moe_tokenizes_as_the_vocab(real_moe_gguf):
    from pyqsa.engine.runner import LlamaModel

    model = LlamaModel(str(real_moe_gguf))
    try:
        assert model.n_vocab == 248320
        text = "Sparse attention, 512 experts: décodage rapide!"
        ids = model.tokenize(text, special=False)
        assert ids and max(ids) < 151936  # the padded ids are never produced
        assert b"".join(model.token_bytes(i) for i in ids).decode() == text
    finally:
        model.close()


def test_real_moe_decode_records(real_moe_gguf, tmp_path):
    recs = decode_records(real_moe_gguf, tmp_path / "decode.jsonl")
    pre = recs[0]
    assert pre["tokens"] == 256 - 3 * 2 and pre["tok_s"] > 0
    assert pre["model_bytes"] == real_moe_gguf.stat().st_size
    for r in recs[1:]:
        assert r["variant"] == "pyqsa" and len(r["step_ms"]) == 2 and r["step_ms_median"] > 0
        assert r["logits_finite"] and r["copy_max_abs_diff"] == 0.0


def test_full_shape_layers_and_size():
    """The default --real-moe: the most layers (a multiple of 4) under 40 GiB of f16 tensors,
    from the config alone (no weights made)."""
    config = synth_model.model_config(False, synth_model.REAL_VOCAB, None, real_moe=True)
    assert config["num_experts"] == 512 and config["num_experts_per_tok"] == 10
    assert config["hidden_size"] == 2560 and config["moe_intermediate_size"] == 512
    assert synth_model.real_moe_layers(config) == 8
    size, params = synth_model.tensor_bytes({**config, "num_hidden_layers": 8})
    assert size == 35_796_683_264 and params == 17_887_462_016  # 33.34 GiB, as documented
    assert synth_model.tensor_bytes({**config, "num_hidden_layers": 12})[0] > 40 << 30
    # the default model is unchanged: 48 layers, 9.79 GiB
    default = synth_model.model_config(False, 151936, None)
    assert synth_model.tensor_bytes(default)[0] == 10_512_047_104
    with pytest.raises(SystemExit, match="multiple of 4"):
        synth_model.model_config(False, 151936, None, layers=6)
