"""Write a full-shape synthetic Qwen4-Exp GGUF (Flash-Next dimensions, random weights).

    python bench/synth_model.py out.gguf                # Flash-Next shape, f16, ~10 GB
    python bench/synth_model.py out.gguf --small        # same structure, tiny dims (CPU checks)
    python bench/synth_model.py out.gguf --locality     # the indexer prefers stable blocks
    python bench/synth_model.py out.gguf --real-moe     # the real MoE and vocab, 8 layers: 33.3 GiB

Shape: 48 layers (every 4th one QSA: 12), hidden 2560, 24 query / 2 KV heads x 256, indexer
4 heads x 128, budget 2048, ratio 4, Gated DeltaNet 16 key / 32 value heads x 128 with conv
kernel 4 (transformers' Qwen4ExpTextConfig defaults), hc_count 4 / hc_lowrank 320 (defaults),
8 experts top-2 instead of 512 top-10, no PLE, the Qwen vocab (151936 tokens; --real-moe, below,
has the real experts and vocab). For speed benchmarks only: the weights are noise.

--locality models what a trained sparse-attention model does and random weights do not: reuse
much of a decode step's selection at the next step. With random weights every query scores the
blocks independently, so consecutive steps share about budget/context of their selections and
the paged KV hot cache misses almost always: the worst case. In published decode traces of a
trained model, DeepSeek-V3.2's indexer (top-2048 tokens, 68,665-token prompt) keeps 35-50% of
its tokens from one step to the next in layers 20-60, against ~3% for random indices (NVIDIA's
TensorRT-LLM tech blog 21; bench/README.md has the address and what --locality measures). Here
every block gets a fixed preference that every query agrees on, through the indexer's tensors
alone (same names, shapes, kernels and cost per step; nothing but the selection changes):
  - the indexer's query heads come in pairs, the second of each pair the first one's rows
    negated (q_odd = -q_even exactly: RMSNorm and RoPE are odd functions), so a pair scores a
    block ReLU(q.k) + ReLU(-q.k) = |q.k| whatever the sign of the query;
  - the last indexer dim, which partial RoPE leaves alone, carries the gain G = LOCALITY_GAIN
    through q_layernorm and k_layernorm (sqrt(G) each; HF's gammas are zero-centred, so the
    stored value is sqrt(G) - 1). A block's normed pooled key there, c_b, is fixed once the
    block completes, so |q.k_b| ~ G |q_j| |c_b| + the other dims (noise ~ sqrt(d)): the blocks
    of largest |c_b| win for every query, while the noise, larger when the token's own |q_j| is
    small, moves blocks across the cut, so selections drift instead of freezing.
RMSNorm leaves at most sqrt(d) in one dim, so |q.k| <= d G and a score (heads x sqrt(d) x G at
most: 4 x 11.3 x 128 < 6000 at Flash-Next dims) stays finite even in f16.

--real-moe gives the MoE and the vocabulary the real model's shape, so MoE products and the
output matmul are measured at the sizes users run: 512 experts, top-10 (512 wide, as the
default), and vocab_size 248320; every other dimension is the default's. Its experts take
512 x 3 x 2560 x 512 x 2 bytes = 3.75 GiB a layer in f16, so 48 layers (188 GiB) cannot be
written: `--layers N` (a multiple of 4, every 4th layer QSA) defaults for --real-moe to the
largest count whose f16 tensors stay under REAL_MOE_MAX_BYTES = 40 GiB (the GPU machine's 64 GiB
disk also holds the builds): 8 layers (2 QSA, 6 Gated DeltaNet), 33.34 GiB (35.80 GB) of
tensors, 17.9 G parameters (computed from the config and printed before writing; 12 layers
would be 48.8 GiB). Every figure measured on it must say so: 8 layers, not 48, so a step's
time is not the full model's. The vocab file's tokenizer (the Qwen one: 151936 tokens) is kept,
its token list padded to 248320 with "[PAD<id>]" entries of type UNUSED, as the converter pads
the ids of an HF checkpoint that have no token (convert/tokenizer.py, from_hf_dir): llama.cpp
takes n_vocab from the token list, and the converter checks that the list and vocab_size agree,
so embedding and output rows cannot outnumber the tokens. Tokenization is unchanged (same
tokens, ids, merges, specials); only sampling or random-token prompts reach the padded ids.
--small --real-moe: the small dims with 512 experts top-10 and the padded vocab, SMALL's 8
layers (0.31 GiB, seconds to write on a CPU).

Weights are made on the fly as the writer asks for them, each tensor from its own seeded
generator (so the file does not depend on thread timing), split in row chunks over a thread
pool that works a bounded window ahead of the writer: RAM stays at a few GiB (about 10 with
--real-moe, whose expert tensors are 2.5 GiB each in f32 as the converter stacks them).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STD = 0.02  # HF's initializer_range: keeps every matmul output near unit scale, so f16 is finite
CHUNK = 1 << 24  # elements per generation task
# --locality's q.k gain of the indexer's last dim. Decode hit rate with --small, 4096-token prompt,
# 200 steps, a hot cache of 2 x the 16 selected blocks, and in brackets the blocks a step shares
# with the step before: gain 16: 0.42 (0.27), 64: 0.82 (0.62), 128: 0.89 (0.74), 256: 0.95 (0.83);
# random weights 0.03 (0.05)
LOCALITY_GAIN = 128.0
# --real-moe: the real model's MoE routing and vocabulary; its default layer count keeps the f16
# file under this many bytes (the GPU machine's disk is 64 GiB, with the builds on it too)
REAL_MOE: dict[str, Any] = {"num_experts": 512, "num_experts_per_tok": 10}
REAL_VOCAB = 248320
REAL_MOE_MAX_BYTES = 40 << 30
# HF initialises these zero-centred RMSNorm gammas to 0 (the graph computes x * (1 + w))
ZERO_CENTRED = ("norm.weight", "layernorm.weight", "norm_key.weight", "norm_query.weight")

FLASH_NEXT: dict[str, Any] = {
    "architectures": ["Qwen4ExpForCausalLM"],
    "model_type": "qwen4_exp_text",
    "hidden_size": 2560,
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "num_attention_heads": 24,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_act": "silu",
    "output_gate_type": "sigmoid",  # explicit: upstream hard-codes sigmoid, HF defaults to silu
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    # partial RoPE: rotary dim 64 = 2 * (11 + 11 + 10), within the indexer head (128)
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "norm_topk_prob": True,
    "hc_count": 4,
    "hc_lowrank": 320,
    "indexer_n_heads": 4,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 128,
    "indexer_budget": 2048,
    "indexer_compress_ratio": 4,
    "tie_word_embeddings": False,
    "initializer_range": STD,
}

# Same structure at tiny dims; budget 64 so that selection prunes at a few hundred tokens.
SMALL: dict[str, Any] = {
    **FLASH_NEXT,
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "head_dim": 64,
    "rope_parameters": {**FLASH_NEXT["rope_parameters"], "mrope_section": [3, 3, 2]},
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "hc_lowrank": 16,
    "indexer_n_heads": 2,
    "indexer_head_dim": 32,
    "indexer_budget": 64,
}


def model_config(
    small: bool,
    vocab_size: int,
    eos_token_id: int | None,
    real_moe: bool = False,
    layers: int | None = None,
) -> dict[str, Any]:
    """The HF config: FLASH_NEXT or SMALL, with REAL_MOE's routing when real_moe, and
    `layers` hidden layers when given (else the base's)."""
    config = {
        **(SMALL if small else FLASH_NEXT),
        **(REAL_MOE if real_moe else {}),
        "vocab_size": vocab_size,
        "eos_token_id": eos_token_id,
    }
    if layers is not None:
        interval = config["full_attention_interval"]
        if layers <= 0 or layers % interval:
            raise SystemExit(f"--layers must be a positive multiple of {interval}, got {layers}")
        config["num_hidden_layers"] = layers
    return config


class _Shapes:
    """A TensorSource with shapes only: enough for the converter's plan, never loaded."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self._shapes = shapes

    def names(self) -> list[str]:
        return list(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def load(self, name: str) -> np.ndarray:
        raise AssertionError(f"{name}: a shapes-only source has no data")


def tensor_bytes(config: dict[str, Any], outtype: str = "f16") -> tuple[int, int]:
    """(bytes, parameters) of the GGUF tensors the converter writes for the config (the file
    adds its metadata, a few MiB with a 248320-token vocab, and alignment padding)."""
    conv = converter()
    cfg = conv.hf_config.parse_config(config)
    plan = conv.tensors.plan_tensors(cfg, _Shapes(conv.hf_tensor_shapes(config)))
    items = [conv.writer.encode(t, outtype) for t in plan.tensors]
    return sum(i.nbytes for i in items), sum(int(np.prod(i.shape)) for i in items)


def real_moe_layers(config: dict[str, Any], outtype: str = "f16") -> int:
    """The largest multiple of full_attention_interval layers (at least one group) whose
    tensors stay under REAL_MOE_MAX_BYTES."""
    step = config["full_attention_interval"]
    n = step
    while tensor_bytes({**config, "num_hidden_layers": n + step}, outtype)[0] < REAL_MOE_MAX_BYTES:
        n += step
    return n


def pad_tokens(tok: Any, n: int) -> Any:
    """The tokenizer with its token list padded to n by UNUSED "[PAD<id>]" entries (what the
    converter gives ids of an HF checkpoint without a token); tokens, ids, merges unchanged."""
    have = len(tok.tokens)
    if have >= n:
        return tok
    from gguf import TokenType

    unused = int(TokenType.UNUSED)
    return dataclasses.replace(
        tok,
        tokens=[*tok.tokens, *(f"[PAD{i}]" for i in range(have, n))],
        token_types=[*tok.token_types, *[unused] * (n - have)],
    )


def _fill(name: str, out: np.ndarray, seed: int, part: int) -> None:
    """HF's initial values (as pyqsa.convert.synthetic.random_tensors makes them)."""
    leaf = name.rsplit(".", 1)[-1]
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), part])
    if name.endswith("linear_attn.norm.weight") or leaf == "dt_bias":
        out[...] = 1.0
    elif leaf == "A_log":
        out[...] = np.log(rng.uniform(1, 16, out.shape))
    elif name.endswith(ZERO_CENTRED):
        out[...] = 0.0
    else:
        rng.standard_normal(out=out, dtype=np.float32)
        out *= np.float32(STD)


def stable_blocks(config: dict[str, Any]) -> Callable[[str, np.ndarray], None]:
    """--locality's change to the generated indexer tensors, in place (the module docstring)."""
    cfg = converter().hf_config.parse_config(config)
    Hi, Di = cfg.indexer_n_heads, cfg.indexer_head_dim
    if Hi % 2 or cfg.rope_dim >= Di:
        raise SystemExit(
            f"--locality needs an even number of indexer heads ({Hi}) and an unrotated indexer "
            f"dim (rotary dim {cfg.rope_dim}, indexer head {Di})"
        )
    gain = np.float32(np.sqrt(LOCALITY_GAIN) - 1)

    def adjust(name: str, a: np.ndarray) -> None:
        if name.endswith("indexer.index_qk_proj.weight"):  # [(Hi + 1) * Di, E]: q heads, k
            q = a[: Hi * Di].reshape(Hi // 2, 2, Di, -1)
            q[:, 1] = -q[:, 0]
        elif name.endswith(("indexer.q_layernorm.weight", "indexer.k_layernorm.weight")):
            a[Di - 1] = gain

    return adjust


class RandomSource:
    """A TensorSource (see pyqsa.convert.checkpoint) whose tensors are generated on demand;
    `adjust(name, array)`, if given, changes each whole tensor in place once it is made."""

    def __init__(
        self,
        shapes: dict[str, tuple[int, ...]],
        seed: int,
        threads: int,
        window_bytes: int = 4 << 30,
        adjust: Callable[[str, np.ndarray], None] | None = None,
    ) -> None:
        self._shapes, self._seed, self._window, self._adjust = shapes, seed, window_bytes, adjust
        self._order = list(shapes)
        self._pool = ThreadPoolExecutor(threads)
        self._pending: dict[str, tuple[np.ndarray, list[Future]]] = {}
        self._pending_bytes = 0
        self._done: set[str] = set()
        self._cursor = 0  # next name (in writing order) to consider for prefetching

    def names(self) -> list[str]:
        return self._order

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def _submit(self, name: str) -> tuple[np.ndarray, list[Future]]:
        a = np.empty(self._shapes[name], np.float32)
        rows = max(1, CHUNK // a[0].size)  # every tensor has at least one axis
        futs = [
            self._pool.submit(_fill, name, a[r : r + rows], self._seed, i)
            for i, r in enumerate(range(0, a.shape[0], rows))
        ]
        return a, futs

    def _prefetch(self) -> None:
        while self._cursor < len(self._order) and self._pending_bytes < self._window:
            name = self._order[self._cursor]
            self._cursor += 1
            if name not in self._done and name not in self._pending:
                self._pending[name] = self._submit(name)
                self._pending_bytes += self._pending[name][0].nbytes

    def load(self, name: str) -> np.ndarray:
        # NOTE: the KV-scale estimate reads a few small QSA tensors before the writer starts
        # at the top; those come synchronously and do not move the prefetch cursor
        job = self._pending.pop(name, None)
        if job is None:
            job = self._submit(name)
        else:
            self._pending_bytes -= job[0].nbytes
        for f in job[1]:
            f.result()
        if self._adjust is not None:
            self._adjust(name, job[0])
        self._done.add(name)
        self._prefetch()
        return job[0]

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def converter() -> ModuleType:
    """pyqsa.convert; its source folder while the package is not installed yet (gpu_run.sh
    writes the model while `pip install -e .` is still building; the converter is pure Python)."""
    try:
        import pyqsa.convert as conv
    except ImportError:
        sys.path.insert(0, str(ROOT))
        import convert as conv
    return conv


def write(
    out: Path,
    small: bool,
    vocab: Path,
    seed: int = 0,
    outtype: str = "f16",
    threads: int | None = None,
    progress: bool = False,
    locality: bool = False,
    real_moe: bool = False,
    layers: int | None = None,
) -> Path:
    conv = converter()
    tok = conv.from_vocab_gguf(vocab)
    if real_moe:
        tok = pad_tokens(tok, REAL_VOCAB)
    config = model_config(small, len(tok.tokens), tok.special_ids.get("eos"), real_moe, layers)
    if real_moe and layers is None and not small:
        config["num_hidden_layers"] = real_moe_layers(config, outtype)
    nbytes, params = tensor_bytes(config, outtype)
    n_layer = config["num_hidden_layers"]
    print(
        f"{n_layer} layers ({n_layer // config['full_attention_interval']} QSA), "
        f"{config['num_experts']} experts top-{config['num_experts_per_tok']}, vocab "
        f"{config['vocab_size']} ({len(tok.tokens)} tokens): {params / 1e9:.2f} G parameters, "
        f"{nbytes / 2**30:.2f} GiB of {outtype} tensors",
        flush=True,
    )
    src = RandomSource(
        conv.hf_tensor_shapes(config),
        seed,
        threads or os.cpu_count() or 2,
        adjust=stable_blocks(config) if locality else None,
    )
    name = "flash-next-synthetic" + ("-realmoe" if real_moe else "")
    name += "-locality" if locality else ""
    try:
        return conv.write_model(config, src, tok, out, outtype, name=name, progress=progress)
    finally:
        src.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--small", action="store_true", help="tiny dims, same structure (CPU checks)")
    ap.add_argument(
        "--locality",
        action="store_true",
        help="the indexer prefers stable blocks: consecutive decode steps share most of their "
        "selections, as trained sparse-attention models do (see the docstring)",
    )
    ap.add_argument(
        "--real-moe",
        action="store_true",
        help=f"the real model's MoE and vocab: {REAL_MOE['num_experts']} experts, top-"
        f"{REAL_MOE['num_experts_per_tok']}, vocab_size {REAL_VOCAB} (tokens padded); fewer "
        "layers to fit the disk (see the docstring)",
    )
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="hidden layers, a multiple of 4 (every 4th QSA); default 48, --small 8, "
        "--real-moe the most whose f16 file stays under 40 GiB (8)",
    )
    ap.add_argument(
        "--vocab", type=Path, help="vocab-only GGUF (default: the Qwen one upstream ships)"
    )
    ap.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.vocab is None:
        args.vocab = converter().qwen_vocab_gguf()
    t0 = time.perf_counter()
    path = write(
        args.out,
        args.small,
        args.vocab,
        args.seed,
        args.outtype,
        args.threads,
        progress=sys.stderr.isatty(),
        locality=args.locality,
        real_moe=args.real_moe,
        layers=args.layers,
    )
    size = path.stat().st_size
    print(f"wrote {path} ({size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
