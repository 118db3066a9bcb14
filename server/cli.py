"""`pyqsa serve` (the OpenAI-compatible server) and `pyqsa chat` (terminal chat): their flags
and commands; the engine they start is server/startup.py's."""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import click

from pyqsa.engine.context import KV_TYPES
from pyqsa.engine.paging import KV_OFFLOAD
from pyqsa.engine.runner import DEVICE_MAX_ADJUST
from pyqsa.engine.scheduler import PREFILL_POLICIES

from .startup import EngineFlags, start_engine

DEFAULT_PORT = 8000


def _check_gib(ctx, param, value: float | None) -> float | None:
    """A --prefix-cache-gib that is no size is refused before anything loads."""
    from pyqsa.engine import prefix_cache

    if value is not None:
        try:
            prefix_cache.budget(value, None, 0)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


def _template(llama_model, override: str | None):
    from .chat_template import ChatTemplate
    from .qwen_template import QWEN_TEMPLATE

    if override:
        source = Path(override).read_text()
    else:
        source = llama_model.meta("tokenizer.chat_template") or QWEN_TEMPLATE
    return ChatTemplate(source, eos_token=llama_model.token_bytes(llama_model.eos).decode())


def _comma_list(value: str, convert, what: str, example: str) -> tuple:
    """A flag's comma-separated values, each converted; one that does not convert is a usage
    error naming what they should be."""
    try:
        return tuple(convert(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: {what} separated by commas, e.g. {example}") from None


def _gpu_list(ctx, param, value: str | None) -> tuple[int, ...] | None:
    """--gpus 0,1: GPU indices, parsed before anything loads (startup checks they are here)."""
    gpus = None if value is None else _comma_list(value, int, "GPU indices", "0,1")
    if gpus is not None and min(gpus) < 0:
        raise click.BadParameter(f"{value!r}: GPU indices are 0 or more")
    return gpus


def _shares(ctx, param, value: str | None) -> tuple[float, ...] | None:
    """--tensor-split 3,1: shares >= 0, not all 0."""
    shares = None if value is None else _comma_list(value, float, "numbers", "3,1")
    if shares is not None and (
        not all(math.isfinite(v) and v >= 0 for v in shares) or sum(shares) <= 0
    ):
        raise click.BadParameter(f"{value!r}: shares are 0 or more, not all 0")
    return shares


def _uvicorn_server(app, host: str, port: int, on_ready: Callable[[str], None]):
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname()
                h = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
                on_ready(f"http://{h}:{bound[1]}")

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    return Server(config)


def _engine_options(f):
    """The engine's options (and --chat-template) for serve and chat: the command receives the
    engine's as one `engine_flags` (startup.EngineFlags), for start_engine(model, engine_flags)."""

    @functools.wraps(f)
    def command(**kw):
        names = [field.name for field in dataclasses.fields(EngineFlags)]
        return f(engine_flags=EngineFlags(**{k: kw.pop(k) for k in names}), **kw)

    options = [
        click.option("--slots", default=8, show_default=True, help="Concurrent sequences."),
        click.option(
            "--ctx",
            default=4096,
            show_default=True,
            help="Context per slot: prompt plus output tokens.",
        ),
        click.option(
            "--batch-tokens",
            default=256,
            show_default=True,
            help="Token budget of one step (decode first, then prompt chunks).",
        ),
        click.option(
            "--prefill-batch-tokens",
            type=click.IntRange(min=1),
            help="Token budget of a step with no decode token in it whose prompts all need more "
            "than --batch-tokens, or of one that finishes every prompt in flight at once (beside "
            "decode tokens only prompts within --batch-tokens) (default: --batch-tokens); larger "
            "prefills faster, at the cost of a larger compute buffer.",
        ),
        click.option(
            "--prefill-policy",
            type=click.Choice(list(PREFILL_POLICIES)),
            default="fair",
            show_default=True,
            help="How prompts share a step: fair shares, or the oldest prompt first (fcfs).",
        ),
        click.option(
            "--max-waiting",
            default=64,
            show_default=True,
            help="Requests that may wait for a slot; more get 429.",
        ),
        click.option("--threads", default=0, help="CPU threads (0: all cores)."),
        click.option(
            "--kv-type",
            type=click.Choice(list(KV_TYPES)),
            default="f16",
            show_default=True,
            help="K/V cache type of the indexed (QSA) layers.",
        ),
        click.option(
            "--gpu-layers",
            type=click.IntRange(min=0),
            help="Layers whose weights go to the GPU (default: all; 0 keeps them on the host).",
        ),
        click.option(
            "--device",
            type=click.IntRange(min=0),
            help="The GPU (0, 1, ...) that holds the model and its caches (default: layers split "
            "over every GPU); the same as --gpus N.",
        ),
        click.option(
            "--gpus",
            callback=_gpu_list,
            help="The GPUs that hold the layers and their caches, e.g. 0,1: one holds the whole "
            "model, several split its layers between them (default: every GPU).",
        ),
        click.option(
            "--tensor-split",
            callback=_shares,
            help="Each GPU's share of the layers where they are split over several, e.g. 3,1 "
            "(default: by the memory each has free).",
        ),
        click.option(
            "--kv-offload",
            type=click.Choice(list(KV_OFFLOAD)),
            default="auto",
            show_default=True,
            help="Where the QSA layers' K/V live: host pages them (pinned host memory plus a "
            "device hot cache), none keeps them on the device, auto pages when they would take "
            "over 80% of what the weights leave of --gpu-memory.",
        ),
        click.option(
            "--hot-blocks",
            type=click.IntRange(min=1),
            help="With paging: hot cache blocks per slot and QSA layer on the device (default: "
            "twice the blocks one query selects, from the model, and on a GPU grown into the "
            "room --gpu-memory leaves, up to a slot's whole context).",
        ),
        click.option(
            "--kv-host-type",
            type=click.Choice(list(KV_TYPES)),
            help="With paging: the host store's K/V type (default: --kv-type). The hot cache "
            "holds the store's blocks as they are, so it has this type too.",
        ),
        click.option(
            "--kv-hot-type",
            type=click.Choice(["f16"]),
            help="With paging and --kv-host-type q8_0: the hot cache's type (default: the host "
            "store's). f16 halves the bytes a miss moves against an all-f16 cache and keeps "
            "f16 attention; each fetched block is dequantized on the device.",
        ),
        click.option(
            "--gpu-memory",
            type=float,
            help="Device memory (GiB per GPU) the server may hold (default: what the GPU has "
            "free at start). Decides auto paging, sizes the hot cache when --hot-blocks is not "
            "given, and start refuses a setting that does not fit, naming the figures.",
        ),
        click.option(
            "--sampling",
            type=click.Choice(["auto", "host", "device"]),
            default="auto",
            show_default=True,
            help="Where tokens are drawn: host copies every sampled row's logits to the host and "
            "draws there; device draws inside the forward pass (the sample op), so only tokens "
            "and asked-for logprobs come back; auto: device when the model runs on a GPU, else "
            "host. logit_bias and penalties go with the draw, which is made on the host when it "
            f"biases or penalizes over {DEVICE_MAX_ADJUST} tokens.",
        ),
        click.option(
            "--prefix-cache-gib",
            type=float,
            callback=_check_gib,
            help="Host memory (GiB) for the prefix cache: states of prompts and replies a request "
            "whose prompt starts with one continues from (default: a fifth of the host memory "
            "available beside the paging host store; 0 turns it off).",
        ),
        click.option(
            "--prefix-cache-stride",
            type=click.IntRange(min=1),
            default=16384,
            show_default=True,
            help="With the prefix cache: also a snapshot every this many tokens inside a prompt, "
            "so a prompt that diverges from a cached one midway reuses most of it.",
        ),
        click.option(
            "--prefix-cache-copy-ahead",
            type=click.IntRange(min=1),
            default=1024,
            show_default=True,
            help="With the prefix cache: a prompt's KV rows are copied to the cache every this "
            "many tokens while it is computed, so few are left to copy beside the decode steps "
            "that follow its end.",
        ),
        click.option(
            "--chat-template",
            type=click.Path(exists=True, dir_okay=False),
            help="Jinja chat template file, instead of the model's own.",
        ),
    ]
    for opt in reversed(options):
        command = opt(command)
    return command


@click.command()
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, help="0: any free port.")
@click.option("--api-key", envvar="PYQSA_API_KEY", help="Require this Bearer key on /v1.")
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Read the key from this file instead (it does not show in ps).",
)
@click.option("--model-name", help="Model id clients send (default: the file name).")
@click.option("--max-body-bytes", default=8 << 20, show_default=True)
@click.option(
    "--default-max-tokens",
    default=1024,
    show_default=True,
    type=click.IntRange(min=1),
    help="Output limit of a request that sets no max_tokens.",
)
@_engine_options
def serve(
    model,
    host,
    port,
    api_key,
    api_key_file,
    model_name,
    max_body_bytes,
    default_max_tokens,
    engine_flags,
    chat_template,
) -> None:
    """Serve MODEL (a qwen4exp GGUF; default: the embedded demo) over an OpenAI API."""
    from .app import create_app

    if api_key_file:
        if api_key:
            raise click.UsageError("give --api-key (or PYQSA_API_KEY) or --api-key-file, not both")
        api_key = Path(api_key_file).read_text().strip()
        if not api_key:
            raise click.UsageError(f"{api_key_file} holds no key")
    engine, llama_model, name = start_engine(model, engine_flags)
    try:
        app = create_app(
            engine,
            llama_model,
            model_name or name,
            _template(llama_model, chat_template),
            api_key,
            max_body_bytes,
            default_max_tokens,
        )

        def ready(url: str) -> None:
            click.echo(f"pyqsa: serving {model_name or name} at {url}/v1", nl=True)
            sys.stdout.flush()

        _uvicorn_server(app, host, port, ready).run()
    finally:
        engine.stop()


@click.command()
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--url", help="Chat with a running server instead (e.g. http://127.0.0.1:8000).")
@click.option("--api-key", envvar="PYQSA_API_KEY")
@click.option("--system", "system_prompt", help="System message.")
@click.option("--max-tokens", type=int, help="Reply length limit.")
@click.option("--temperature", default=0.7, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-turn tokens.")
@_engine_options
def chat(
    model,
    url,
    api_key,
    system_prompt,
    max_tokens,
    temperature,
    ignore_eos,
    engine_flags,
    chat_template,
) -> None:
    """Chat in the terminal with MODEL (default: the embedded demo) or a server at --url.

    Replies stream; Ctrl-C stops a reply, /reset clears the history, /exit (or Ctrl-D)
    quits. End a line with \\ to continue it, or wrap a block in \"\"\" lines.
    """
    from .chat_client import ChatSession

    if url and model:
        raise click.UsageError("give MODEL or --url, not both")
    if url:
        ChatSession(url, api_key, system_prompt, max_tokens, temperature, ignore_eos).run()
        return
    from .app import create_app

    engine, llama_model, name = start_engine(model, engine_flags)
    app = create_app(engine, llama_model, name, _template(llama_model, chat_template), None)
    ready = threading.Event()
    urls: list[str] = []

    def on_ready(u: str) -> None:
        urls.append(u)
        ready.set()

    server = _uvicorn_server(app, "127.0.0.1", 0, on_ready)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        if not ready.wait(60):
            raise click.ClickException("the in-process server did not start")
        ChatSession(urls[0], None, system_prompt, max_tokens, temperature, ignore_eos).run()
    finally:
        server.should_exit = True
        thread.join(5)
        engine.stop()
