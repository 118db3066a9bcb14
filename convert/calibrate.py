"""KV scales for the indexed layers: absmax calibration in pyqsa's runtime, or a weight estimate.

Calibration loads the converted GGUF with the patched libllama (upstream's ctypes API), runs the
text through it and reads, through the scheduler's eval callback, the tensors the qwen4exp graph
names `Kcur-<il>` (after k_norm and RoPE: what enters the K cache) and `Vcur-<il>`. It needs no
HF model, so it works for checkpoints far too large for transformers on a CPU.
"""

from __future__ import annotations

import ctypes
import logging
import math
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import ConvertError
from .qsa import KVScales, QsaLayout

# Gaussian margin of the weight estimate: P(|z| > 6) ~ 2e-9 per element
Z_MARGIN = 6.0
GGML_TYPE_F32 = 0


def weight_estimate(layout: QsaLayout, get: Callable[[str], np.ndarray]) -> KVScales:
    """Absmax of K and V per KV head, estimated from weights alone (no forward pass).

    `get(name)` returns a GGUF tensor as f32 in numpy order (gammas already +1).

    K: k_norm is an RMSNorm, so a head's normalised vector has RMS 1 (each element RMS 1 on
    average, and at most sqrt(D) in size); the gamma scales element i, and RoPE rotates pairs,
    which never grows a pair's norm. Taking the elements as roughly Gaussian, we use
    max|gamma| * min(Z, sqrt(D)): Z sigma, capped by the exact bound sqrt(D) * max|gamma|.

    V: v = W_v x, with x the attention input, the hyper-connection mix: a mean over streams of
    sigmoid weights (in (0, 1)) times each stream's RMS-normalised, gamma-scaled input. So the
    per-element RMS of x is at most rho = max over streams of RMS(gamma_stream). For x roughly
    isotropic, row j of W_v gives v_j an RMS of ||W_v[j]|| * rho; we use Z * rho * max_j
    ||W_v[j]|| per head, capped by the Cauchy-Schwarz bound sqrt(E) * rho_max * ||W_v[j]||
    with rho_max = max|gamma|.
    """
    D, H, E, hc = layout.head_dim, layout.n_head_kv, layout.n_embd, layout.hc_count
    ks, vs = [], []
    for il in layout.layers:
        g = np.abs(get(f"blk.{il}.attn_k_norm.weight").astype(np.float64))
        ks += [float(g.max() * min(Z_MARGIN, math.sqrt(D)))] * H
        hcn = get(f"blk.{il}.hc_attn_norm.weight").astype(np.float64).reshape(hc, E)
        rho = float(np.sqrt((hcn**2).mean(axis=1)).max())
        rho_max = float(np.abs(hcn).max())
        rows = np.linalg.norm(get(f"blk.{il}.attn_v.weight").astype(np.float64), axis=1)
        for h in range(H):
            r = float(rows[h * D : (h + 1) * D].max())
            vs.append(min(Z_MARGIN * rho * r, math.sqrt(E) * rho_max * r))
    return KVScales(tuple(ks), tuple(vs), "weight-estimate")


class _Tensor(ctypes.Structure):
    """The leading fields of ggml.h's struct ggml_tensor (pinned upstream), up to the name."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def calibrate(
    gguf_path: Path, layout: QsaLayout, text: str, max_tokens: int = 4096, nfc: bool = False
) -> KVScales:
    """Run `text` (at most max_tokens) through the GGUF; return absmax K/V per KV head.

    `nfc`: normalise the text first, as pyqsa does for files whose HF tokenizer applies NFC.
    """
    import llama_cpp as L

    want = {}
    for j, il in enumerate(layout.layers):
        want[f"Kcur-{il}".encode()] = ("k", j)
        want[f"Vcur-{il}".encode()] = ("v", j)
    H, D = layout.n_head_kv, layout.head_dim
    amax = {"k": np.zeros((len(layout.layers), H)), "v": np.zeros((len(layout.layers), H))}
    ggml = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml-base.so.0"))
    ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 2
    ggml.ggml_op_name.restype = ctypes.c_char_p
    ggml.ggml_op_name.argtypes = [ctypes.c_int]

    def observe(tp: int, ask: bool, _user: int) -> bool:
        t = _Tensor.from_address(tp)
        hit = want.get(t.name)
        # "Kcur-<il>" names both the raw projection and the roped K; only the 3-D [D, H, T]
        # f32 results are read (the roped K, and V's reshape of the same data)
        ok = (
            hit is not None
            and t.type == GGML_TYPE_F32
            and t.ne[0] == D
            and t.ne[1] == H
            and (hit[0] == "v" or ggml.ggml_op_name(t.op) == b"ROPE")
        )
        if ask or not ok:
            return ok or not ask  # ask: observe this node?  else: keep computing
        n_tok = t.ne[2] * t.ne[3]
        if t.nb[1] != 4 * D or t.nb[2] != 4 * D * H:
            return True  # not contiguous: never the case for these nodes on CPU
        buf = np.empty((n_tok, H, D), dtype=np.float32)
        ggml.ggml_backend_tensor_get(tp, buf.ctypes.data, 0, buf.nbytes)
        kind, j = hit
        amax[kind][j] = np.maximum(amax[kind][j], np.abs(buf).max(axis=(0, 2)))
        return True

    from pyqsa.engine.context import ContextConfig, ContextError, load_model, open_context

    log = logging.getLogger("llama-cpp-python")
    level = log.level
    log.setLevel(logging.ERROR)  # llama.cpp's load log is noise here
    L.llama_backend_init()
    try:
        model = load_model(str(gguf_path))
    except ContextError:
        log.setLevel(level)
        raise ConvertError(f"{gguf_path}: the runtime could not load the converted file") from None
    ctx = None
    try:
        vocab = L.llama_model_get_vocab(model)
        data = (unicodedata.normalize("NFC", text) if nfc else text).encode("utf-8")
        cap = len(data) + 16
        toks = (L.llama_token * cap)()
        n = L.llama_tokenize(vocab, data, len(data), toks, cap, True, False)
        n = min(n, max_tokens)
        if n <= 0:
            raise ConvertError("calibration text gave no tokens")
        cb = L.ggml_backend_sched_eval_callback(observe)
        cfg = ContextConfig(ctx_per_seq=n, n_batch=min(n, 512))
        try:
            ctx = open_context(model, cfg, cb_eval=cb)
        except ContextError as e:
            raise ConvertError(f"{gguf_path}: {e}") from None
        for start in range(0, n, cfg.n_batch):
            m = min(cfg.n_batch, n - start)
            chunk = (L.llama_token * m)(*toks[start : start + m])
            if L.llama_decode(ctx, L.llama_batch_get_one(chunk, m)) != 0:
                raise ConvertError("calibration: llama_decode failed")
    finally:
        if ctx:
            L.llama_free(ctx)
        L.llama_model_free(model)
        log.setLevel(level)
    if not amax["k"].any():
        raise ConvertError("calibration saw no K/V tensors of the indexed layers")
    return KVScales(
        tuple(amax["k"].ravel().tolist()),
        tuple(amax["v"].ravel().tolist()),
        f"calibrated:{n} tokens",
    )
