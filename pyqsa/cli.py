"""The `pyqsa` command line."""

from __future__ import annotations

import json

import click

from pyqsa.bench.cli import bench
from pyqsa.convert.cli import convert, imatrix_cmd, inspect_cmd, quantize_cmd
from pyqsa.server.cli import chat, serve

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pyqsa")
def main() -> None:
    """Serve Qwen4-Exp (QSA sparse attention) models with llama.cpp."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Show pyqsa and upstream versions, the backend, and the devices seen."""
    from . import native

    b = native.build_info()
    devs = native.devices()
    if as_json:
        click.echo(json.dumps({"build": b.__dict__, "devices": [d.__dict__ for d in devs]}))
        return
    click.echo(f"pyqsa:           {b.version}")
    click.echo(f"upstream commit: {b.upstream_commit} (llama.cpp)")
    archs = f" (archs {b.cuda_archs})" if b.cuda_archs else ""
    click.echo(f"backend:         {b.backend}{archs}")
    click.echo(f"library:         {native.lib_dir()}")
    click.echo("devices:")
    for d in devs:
        mem = (
            f"{d.memory_free / 2**30:.1f} / {d.memory_total / 2**30:.1f} GiB free"
            if d.memory_total
            else "memory n/a"
        )
        click.echo(f"  {d.name:8s} {d.type:5s} {d.description} ({mem})")


main.add_command(convert)
main.add_command(inspect_cmd)
main.add_command(quantize_cmd)
main.add_command(imatrix_cmd)
main.add_command(serve)
main.add_command(chat)
main.add_command(bench)

if __name__ == "__main__":
    main()
