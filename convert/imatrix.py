"""`pyqsa imatrix`: an importance matrix of a qwen4exp GGUF over a text file, as llama-imatrix
computes it, for `pyqsa quantize --imatrix`.

The text is tokenized whole and cut into chunks of `chunk` tokens (the rest dropped); each chunk
runs from an empty memory in one sequence, every token an output, so the last layer's products
see every token too. The statistics are gathered inside libllama by pyqsa's collector
(pyqsa_imatrix_collect in native/include/pyqsa.h): no graph node crosses into Python.
"""

from __future__ import annotations

import math
from pathlib import Path

from .errors import ConvertError
from .imatrix_file import Imatrix, write_imatrix

DEFAULT_CHUNK = 512
MIN_CHUNK = 16  # the collector skips dense products of fewer rows
MAX_BATCH = 2048  # tokens a llama_decode: longer chunks go in equal parts


def read_text(path: Path) -> str:
    if not path.is_file():
        raise ConvertError(f"{path}: not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: unreadable text ({e})") from None
    if not text.strip():
        raise ConvertError(f"{path}: empty text")
    return text


def chunks_of(tokens: list[int], chunk: int, max_chunks: int | None, bos: int | None):
    """The token chunks llama-imatrix runs: whole chunks only, the first token BOS when the
    vocabulary adds one."""
    n = len(tokens) // chunk
    if max_chunks is not None:
        n = min(n, max_chunks)
    out = [tokens[i * chunk : (i + 1) * chunk] for i in range(n)]
    if bos is not None:
        for c in out:
            c[0] = bos
    return out


def _decode(L, ctx, toks: list[int], pos0: int) -> int:
    batch = L.llama_batch_init(len(toks), 0, 1)
    try:
        for i, tok in enumerate(toks):
            batch.token[i], batch.pos[i] = tok, pos0 + i
            batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, True
        batch.n_tokens = len(toks)
        return L.llama_decode(ctx, batch)
    finally:
        L.llama_batch_free(batch)


def compute_imatrix(
    model_path: str | Path,
    text_path: str | Path,
    out: str | Path,
    chunk: int = DEFAULT_CHUNK,
    max_chunks: int | None = None,
    threads: int = 0,
    progress: bool = True,
) -> Imatrix:
    """Collect the importance matrix of the GGUF over the text file's chunks, write it to `out`
    (llama.cpp's imatrix GGUF format) and return it."""
    from tqdm import tqdm

    from pyqsa import native
    from pyqsa.engine.context import ContextConfig, ContextError, open_context
    from pyqsa.engine.runner import LlamaModel, RunnerError

    from .quantize import open_input
    from .writer import check_output

    model_path, text_path, out = Path(model_path), Path(text_path), Path(out)
    if chunk < MIN_CHUNK:
        raise ConvertError(f"--chunk must be at least {MIN_CHUNK} tokens, got {chunk}")
    if max_chunks is not None and max_chunks < 1:
        raise ConvertError(f"--chunks must be at least 1, got {max_chunks}")
    open_input(model_path, "computes importance matrices of")
    check_output(out, 0)
    text = read_text(text_path)
    try:
        model = LlamaModel(str(model_path))
    except RunnerError as e:
        raise ConvertError(f"{model_path}: {e}") from None
    import llama_cpp as L

    collector = native.ImatrixCollector()
    ctx = None
    try:
        tokens = model.tokenize(text, special=False)
        bos = L.llama_vocab_bos(model.vocab) if L.llama_vocab_get_add_bos(model.vocab) else None
        runs = chunks_of(tokens, chunk, max_chunks, bos)
        if not runs:
            raise ConvertError(
                f"{text_path}: {len(tokens)} tokens, fewer than one chunk of {chunk} (--chunk)"
            )
        parts = math.ceil(chunk / MAX_BATCH)
        n_batch = math.ceil(chunk / parts)
        cfg = ContextConfig(ctx_per_seq=chunk, n_batch=n_batch, n_threads=threads, kv_type="f32")
        try:
            ctx = open_context(
                model.ptr, cfg, cb_eval=collector.callback, cb_eval_user_data=collector.user_data
            )
        except ContextError as e:
            raise ConvertError(f"{model_path}: {e}") from None
        memory = L.llama_get_memory(ctx)
        for i, toks in enumerate(tqdm(runs, unit="chunk", desc="imatrix", disable=not progress)):
            L.llama_memory_clear(memory, True)
            for start in range(0, chunk, n_batch):
                if _decode(L, ctx, toks[start : start + n_batch], start) != 0:
                    raise ConvertError(f"imatrix: llama_decode failed on chunk {i}")
                if (err := collector.error()) is not None:
                    raise ConvertError(f"imatrix: chunk {i}: {err}")
        im = Imatrix(collector.entries(), len(runs), chunk, (str(text_path),))
    finally:
        if ctx:
            L.llama_free(ctx)
        collector.free()
        model.close()
    if not im.entries:
        raise ConvertError(f"{model_path}: no weight products seen (not a qwen4exp graph?)")
    write_imatrix(im, out)
    return im
