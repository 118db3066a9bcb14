"""Click commands `pyqsa convert`, `inspect`, `quantize`, `imatrix` (registered in pyqsa/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .errors import ConvertError
from .imatrix import DEFAULT_CHUNK
from .quantize import TYPES
from .writer import OUTTYPES

# the quantization types `convert --outtype` reaches through `quantize` (q8_0 is written directly)
QUANTIZED = [t for t in TYPES if t.lower() not in OUTTYPES]


def _fail(e: ConvertError) -> None:
    click.echo(f"pyqsa: error: {e}", err=True)
    raise SystemExit(2)


def _read_text(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: unreadable calibration text ({e})") from None


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="GGUF file to write.")
@click.option(
    "--outtype",
    type=click.Choice([*OUTTYPES, *QUANTIZED], case_sensitive=False),
    help="Tensor type, or a quantization type as `pyqsa quantize` takes [default: f32].",
)
@click.option(
    "--calibrate",
    "calib",
    type=click.Path(path_type=Path),
    help="Text file: calibrate the KV scales on it (else they are estimated from weights).",
)
@click.option(
    "--refresh-qsa",
    is_flag=True,
    help="SOURCE is a GGUF: rewrite only its pyqsa.* keys (QSA layer map, KV scales).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def convert(
    source: Path,
    output: Path | None,
    outtype: str,
    calib: Path | None,
    refresh_qsa: bool,
    quiet: bool,
) -> None:
    """Convert an HF Qwen4-Exp checkpoint folder to GGUF (or refresh a GGUF's QSA keys)."""
    from . import pipeline

    try:
        text = _read_text(calib)
        if refresh_qsa:
            if outtype:
                raise ConvertError("--outtype does not apply to --refresh-qsa (weights are kept)")
            scales = pipeline.refresh_qsa(source, text, out_path=output, progress=not quiet)
            click.echo(f"refreshed QSA keys of {output or source} ({scales.source})")
            return
        if output is None:
            raise ConvertError("missing -o/--output")
        if outtype in QUANTIZED:
            from .quantize import convert_quantized

            convert_quantized(source, output, outtype, text, progress=not quiet)
        else:
            pipeline.convert_checkpoint(
                source, output, (outtype or "f32").lower(), text, progress=not quiet
            )
        click.echo(f"wrote {output}")
    except ConvertError as e:
        _fail(e)


@click.command(name="inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--slots", type=click.IntRange(min=1), default=8, help="As serve's [default: 8].")
@click.option("--ctx", type=click.IntRange(min=1), default=4096, help="As serve's [default: 4096].")
@click.option(
    "--kv-type", type=click.Choice(["f16", "q8_0", "f32"]), default="f16", help="As serve's."
)
def inspect_cmd(path: Path, as_json: bool, slots: int, ctx: int, kv_type: str) -> None:
    """Show a qwen4exp GGUF's layer map, QSA parameters, KV scales, tensor sizes by type and
    the device memory `serve --slots N --ctx C` needs for it, with and without paging."""
    from .inspect import render, summarize
    from .memory import render_memory, serve_memory

    try:
        s = summarize(path)
        m = serve_memory(path, s.n_bytes, slots, ctx, kv_type)
    except ConvertError as e:
        _fail(e)
        return
    if as_json:
        click.echo(json.dumps({**s.to_dict(), "serve_memory": m.to_dict()}))
        return
    click.echo(render(s))
    click.echo(render_memory(m))


@click.command(name="quantize")
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
@click.argument("qtype", metavar="TYPE", type=click.Choice(list(TYPES), case_sensitive=False))
@click.option(
    "--imatrix",
    type=click.Path(path_type=Path),
    help="Importance matrix (from `pyqsa imatrix` or llama-imatrix) weighting the rounding.",
)
@click.option("--threads", type=int, default=0, help="Threads [default: all cores].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def quantize_cmd(
    source: Path, output: Path, qtype: str, imatrix: Path | None, threads: int, quiet: bool
) -> None:
    """Quantize a qwen4exp GGUF (f32/f16/bf16) to TYPE, keeping QSA's tensors at f32."""
    from .quantize import quantize

    try:
        quantize(source, output, qtype, threads=threads, imatrix=imatrix, progress=not quiet)
    except ConvertError as e:
        _fail(e)
        return
    click.echo(f"wrote {output}")


@click.command(name="imatrix")
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("text", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output file.")
@click.option(
    "--chunk",
    type=int,
    default=DEFAULT_CHUNK,
    show_default=True,
    help="Tokens a chunk (llama-imatrix's -c); each chunk runs from an empty context.",
)
@click.option("--chunks", type=int, help="Run at most this many chunks [default: all].")
@click.option("--threads", type=int, default=0, help="Threads [default: all cores].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def imatrix_cmd(
    model: Path,
    text: Path,
    output: Path,
    chunk: int,
    chunks: int | None,
    threads: int,
    quiet: bool,
) -> None:
    """Importance matrix of a qwen4exp GGUF over a text file, for `pyqsa quantize --imatrix`
    (llama.cpp's imatrix GGUF format)."""
    from .imatrix import compute_imatrix

    try:
        im = compute_imatrix(model, text, output, chunk, chunks, threads, progress=not quiet)
    except ConvertError as e:
        _fail(e)
        return
    unrouted = f", {im.unrouted()} experts never routed to" if im.unrouted() else ""
    click.echo(
        f"wrote {output}: {len(im.entries)} weights over {im.chunk_count} chunks of "
        f"{im.chunk_size} tokens{unrouted}"
    )
