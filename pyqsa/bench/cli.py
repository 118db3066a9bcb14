"""`pyqsa bench`: the benchmark scenarios on this machine, a table, and one JSON per scenario."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click

from . import record
from .scenarios import PRESETS, SCENARIOS, Bench, run


def _preset(quick: bool) -> str:
    if quick:
        return "quick"
    from pyqsa.engine.paging import gpu_devices

    return "gpu" if gpu_devices() else "cpu"


@click.command()
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice([*SCENARIOS, "all"]),
    help="Repeatable; default: all. steps: decode and prefill through the C API; server: "
    "TTFT and decode rates over HTTP; capacity: device and host bytes by category; long: "
    "long prompts at once, paged and unpaged; prefix: follow-up turns with the prefix cache.",
)
@click.option(
    "--quick", is_flag=True, help="Small sizes (a minute or two on a CPU) instead of the full ones."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("pyqsa-bench"),
    show_default=True,
    help="Folder of the result files, <date>-<commit>-<scenario>.json.",
)
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--repeats", type=click.IntRange(min=1), help="Runs a figure's median is taken over.")
@click.option(
    "--upstream-lib",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="steps: also run an unpatched llama.cpp build (the folder of its libllama.so).",
)
def bench(model, scenarios, quick, out, threads, repeats, upstream_lib) -> None:
    """Measure MODEL (default: the embedded demo) on this machine, one scenario at a time.

    Sizes follow the machine: the full-shape ones on a CUDA build with a GPU, smaller ones
    on a CPU, the smallest with --quick. Scenarios are reported apart, never summed."""
    from pyqsa.demo_model import demo_model_path

    names = SCENARIOS if not scenarios or "all" in scenarios else tuple(dict.fromkeys(scenarios))
    if upstream_lib is not None and not (upstream_lib / "libllama.so").exists():
        raise click.UsageError(f"--upstream-lib {upstream_lib}: no libllama.so there")
    path = Path(model) if model else demo_model_path()
    preset = _preset(quick)
    assert preset in PRESETS
    click.echo(f"pyqsa bench: {path.name}, {preset} sizes, scenarios {', '.join(names)}")
    docs, written = [], []
    with tempfile.TemporaryDirectory(prefix="pyqsa-bench-") as work:
        spec = Bench(path, preset, Path(work), threads, repeats, upstream_lib, out)
        for name in names:
            t0 = time.monotonic()
            try:
                doc = run(name, spec)
            except Exception as e:
                raise click.ClickException(f"{name}: {e}") from e
            doc["wall_s"] = round(time.monotonic() - t0, 1)
            docs.append(doc)
            written.append(record.write(doc, out))
    click.echo(record.table(docs))
    for doc, p in zip(docs, written, strict=True):
        click.echo(f"{doc['scenario']}: {p} ({doc['wall_s']} s)")
