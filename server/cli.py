"""`pyqsa serve` (the OpenAI-compatible server) and `pyqsa chat` (terminal chat)."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import click

from pyqsa.engine.context import KV_TYPES
from pyqsa.engine.paging import KV_OFFLOAD
from pyqsa.engine.runner import DEVICE_MAX_ADJUST
from pyqsa.engine.scheduler import PREFILL_POLICIES

DEFAULT_PORT = 8000


def _load(
    model: str | None,
    slots: int,
    ctx: int,
    batch_tokens: int,
    prefill_batch_tokens: int | None,
    prefill_policy: str,
    max_waiting: int,
    threads: int,
    kv_type: str,
    gpu_layers: int | None,
    device: int | None,
    kv_offload: str,
    hot_blocks: int | None,
    kv_host_type: str | None,
    kv_hot_type: str | None,
    gpu_memory: float | None,
    sampling: str,
    prefix_cache_gib: float | None,
    prefix_cache_stride: int,
):
    """Start an engine on MODEL (the embedded demo model when None)."""
    from pyqsa.demo_model import demo_model_path
    from pyqsa.engine import EngineConfig, device_budget, load_engine, paging
    from pyqsa.engine.runner import RunnerError

    paging_flags = (
        ("--hot-blocks", hot_blocks),
        ("--kv-host-type", kv_host_type),
        ("--kv-hot-type", kv_hot_type),
    )
    for flag, value in paging_flags:
        if kv_offload == "none" and value is not None:
            raise click.UsageError(f"{flag} needs paging: --kv-offload host or auto, not none")
    # with paging every QSA layer's K/V is in the host store, and the hot cache holds copies of
    # its blocks, so the store's type is the K/V type
    paged_type = kv_host_type or kv_type
    if kv_hot_type is not None and paged_type != "q8_0":
        raise click.UsageError(
            f"--kv-hot-type {kv_hot_type} needs a q8_0 host store (--kv-host-type q8_0), "
            f"not {paged_type}"
        )
    if device is not None:
        _check_device(device)
    free_at_start = paging.device_free(gpu_layers, device)
    gpu = free_at_start is not None  # a GPU build, layers on a GPU
    if gpu_memory is not None and not gpu:
        raise click.UsageError("--gpu-memory needs a GPU build with layers on a GPU")
    budget = None
    if gpu:
        n_devices = 1 if device is not None else len(paging.gpu_devices())
        try:
            budget = device_budget.DeviceBudget.of(gpu_memory, free_at_start, n_devices)
        except device_budget.BudgetError as e:
            raise click.BadParameter(str(e), param_hint="'--gpu-memory'") from None
    # the sample op's per-sequence draws cost a GPU less than the logits' round trip, and a CPU
    # more than drawing rows in parallel on the host (bench/README.md, 2026-12-01)
    on_device = sampling == "device" or (sampling == "auto" and gpu)
    if model is None:
        click.echo(
            "pyqsa: no model given, using the embedded demo model (random weights)", err=True
        )
        path, name = str(demo_model_path()), "pyqsa-demo"
    else:
        path, name = model, Path(model).name.removesuffix(".gguf")
    try:
        config = EngineConfig(
            path,
            n_slots=slots,
            ctx_per_slot=ctx,
            max_batch_tokens=batch_tokens,
            max_prefill_tokens=prefill_batch_tokens or 0,
            prefill_policy=prefill_policy,
            max_waiting=max_waiting,
            n_threads=threads,
            kv_type=kv_type,
            gpu_layers=gpu_layers,
            device=device,
            sample_on_device=on_device,
            prefix_stride=prefix_cache_stride,
        )
    except ValueError as e:  # settings that do not fit together, in the flags' names
        raise click.UsageError(_in_flag_names(str(e))) from None
    if gpu and hot_blocks is not None and hot_blocks > paging.MAX_HOT_BLOCKS_GPU:
        raise click.UsageError(
            f"--hot-blocks {hot_blocks}: a GPU takes at most {paging.MAX_HOT_BLOCKS_GPU}"
        )
    kv = None  # the model's QSA K/V geometry, read where paging may be on
    if kv_offload == "host" or hot_blocks is not None or (kv_offload == "auto" and gpu):
        kv = _qsa_kv(path, hot_blocks)
    # what can be refused is refused before the weights load; auto on a GPU decides after,
    # against the device memory they left free
    plan = None
    if kv_offload == "host":
        plan = _paging_plan(kv, "host", hot_blocks, slots * ctx, paged_type, None)
    elif kv_offload == "none" or not gpu:
        plan = paging.PagingPlan(0, 0)
    try:
        llama_model = _load_model(path, gpu_layers, device)
        room = None  # the device memory free now that the budget leaves the K/V
        if budget is not None:
            free_now = paging.device_free(gpu_layers, device)
            weights = free_at_start - free_now
            budget.check_weights(weights)
            room = min(free_now, budget.kv_room(weights))
        if plan is None:  # auto on a GPU, so with a budget
            plan = _paging_plan(kv, "auto", hot_blocks, slots * ctx, paged_type, room)
        unused = [f for f, v in paging_flags if v]
        if unused and not plan.hot_blocks:
            click.echo(
                "pyqsa: --kv-offload auto keeps the K/V on the device (no GPU, or they fit): "
                f"{' and '.join(unused)} unused; --kv-offload host pages anyway",
                err=True,
            )
        config = dataclasses.replace(
            config,
            hot_blocks=plan.hot_blocks,
            kv_type=paged_type if plan.hot_blocks else kv_type,
            kv_hot_type=kv_hot_type if plan.hot_blocks else None,
            prefix_cache_bytes=_prefix_budget(prefix_cache_gib, plan),
            device_memory_limit=budget.limit if budget is not None else 0,
        )
        if budget is not None and plan.hot_blocks and hot_blocks is None:
            most = min(paging.MAX_HOT_BLOCKS_GPU, -(-ctx // kv.ratio))
            config = _grow_hot_cache(llama_model, config, budget, most)
        engine, llama_model = load_engine(config, llama_model)
        if budget is not None:
            try:
                budget.check(engine.stats().ledger)
            except device_budget.BudgetError:
                engine.stop()
                raise
    except RunnerError as e:
        raise click.ClickException(str(e)) from None
    except device_budget.BudgetError as e:
        raise click.ClickException(str(e)) from None
    stats = engine.stats()
    click.echo(f"pyqsa: memory {_ledger_line(stats.ledger)}", err=True)
    if budget is not None:
        held = sum(device_budget.device_bytes(stats.ledger).values())
        click.echo(
            f"pyqsa: device budget {_size(budget.limit)} "
            f"({'--gpu-memory' if gpu_memory is not None else 'free at start'}): the ledger "
            f"holds {_size(held)}, the CUDA runtime's reserve "
            f"{_size(device_budget.RUNTIME_RESERVE)}",
            err=True,
        )
    if stats.paging is not None:
        store = stats.ledger.get("host.kv") or plan.kv_bytes
        click.echo(
            f"pyqsa: paging: hot cache {stats.paging['hot_blocks']} blocks per slot and QSA "
            f"layer; host store {_size(store)} ({config.kv_type} K/V of {slots} x {ctx} tokens)",
            err=True,
        )
    if config.prefix_cache_bytes:
        click.echo(
            f"pyqsa: prefix cache: up to {_size(config.prefix_cache_bytes)} of host memory, "
            f"snapshots where prompts and replies end and every {prefix_cache_stride} prompt "
            "tokens",
            err=True,
        )
    else:
        click.echo("pyqsa: prefix cache: off", err=True)
    chosen = f"{sampling}: " if sampling == "auto" else ""
    if on_device:
        click.echo(
            f"pyqsa: sampling: device ({chosen}tokens drawn inside the forward pass; a draw "
            f"with over {DEVICE_MAX_ADJUST} biased or penalized tokens is made on the host)",
            err=True,
        )
    else:
        click.echo(
            f"pyqsa: sampling: host ({chosen}each sampled row's logits copied out)", err=True
        )
    return engine, llama_model, name


def _grow_hot_cache(llama_model, config, budget, most: int):
    """config with the hot cache grown into the device memory a first context of its
    hot_blocks leaves of the budget (engine/device_budget.py), said on stderr; that context is
    freed before the engine's is made."""
    from pyqsa.engine.runner import LlamaRunner

    probe = LlamaRunner(llama_model, config)
    try:
        ledger = probe.ledger()
    finally:
        probe.close()
    budget.check(ledger)
    grown = budget.grown_hot_blocks(ledger, config.hot_blocks, most)
    if grown > config.hot_blocks:
        click.echo(
            f"pyqsa: paging: the hot cache grows from {config.hot_blocks} to {grown} blocks per "
            f"slot and QSA layer, into the room {budget.flag} leaves (--hot-blocks sets it)",
            err=True,
        )
        config = dataclasses.replace(config, hot_blocks=grown)
    return config


def _check_device(device: int) -> None:
    """--device N names a GPU (an index among the GPU devices, llama.cpp's main_gpu); anything
    else is a one-line usage error."""
    from pyqsa import native
    from pyqsa.engine.paging import gpu_devices

    gpus = gpu_devices()
    if not gpus:
        where = "a CPU-only build" if native.build_info().backend == "CPU" else "none found"
        raise click.UsageError(f"--device {device}: there is no GPU ({where})")
    if device >= len(gpus):
        names = ", ".join(f"{i} ({d.description or d.name})" for i, d in enumerate(gpus))
        raise click.BadParameter(f"{device}: the GPUs here are {names}", param_hint="'--device'")


def _qsa_kv(path: str, hot_blocks: int | None):
    """The model's QSA K/V geometry (engine/paging.py); a --hot-blocks too small for it is a
    usage error."""
    from pyqsa.engine.paging import PagingError, QsaKv

    try:
        kv = QsaKv.from_gguf(path)
    except PagingError as e:
        raise click.ClickException(str(e)) from None
    if hot_blocks is not None and hot_blocks < kv.blocks_selected:
        raise click.BadParameter(
            f"{hot_blocks} cannot hold the {kv.blocks_selected} blocks one query selects "
            f"(indexer top_k {kv.top_k} / compress ratio {kv.ratio})",
            param_hint="'--hot-blocks'",
        )
    return kv


def _paging_plan(kv, kv_offload, hot_blocks, n_tokens, kv_type, free_device):
    """engine.paging.plan with the host memory free now; a refusal is a one-line error."""
    from pyqsa.engine import paging

    try:
        return paging.plan(
            kv, kv_offload, hot_blocks, n_tokens, kv_type, free_device, paging.host_available()
        )
    except paging.PagingError as e:
        raise click.ClickException(str(e)) from None


def _check_gib(ctx, param, value: float | None) -> float | None:
    """A --prefix-cache-gib that is no size is refused before anything loads."""
    from pyqsa.engine import prefix_cache

    if value is not None:
        try:
            prefix_cache.budget(value, None, 0)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


def _prefix_budget(gib: float | None, plan) -> int:
    """--prefix-cache-gib in bytes, beside the paging host store in the host memory free now."""
    from pyqsa.engine import paging, prefix_cache

    reserved = plan.kv_bytes if plan.hot_blocks else 0
    try:
        return prefix_cache.budget(gib, paging.host_available(), reserved)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--prefix-cache-gib'") from None


def _load_model(path: str, gpu_layers: int | None, device: int | None):
    """The LlamaModel at path, said on stderr: a line naming the file and its size, and on a
    terminal a bar as the weights load; then the seconds it took."""
    from tqdm import tqdm

    from pyqsa.engine.runner import LlamaModel

    click.echo(f"pyqsa: loading {path} ({_size(os.path.getsize(path))})", err=True)
    t0 = time.monotonic()
    bar_format = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}"
    with tqdm(
        total=100, desc="pyqsa: loading", bar_format=bar_format, file=sys.stderr, disable=None
    ) as bar:
        model = LlamaModel(
            path, gpu_layers, device, progress=lambda f: bar.update(int(100 * f) - bar.n)
        )
    click.echo(f"pyqsa: loaded in {time.monotonic() - t0:.1f} s", err=True)
    return model


def _size(n: int) -> str:
    """Bytes as GiB from 1 GiB on, else MiB (the demo's and the hot caches' figures)."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _ledger_line(ledger: dict[str, int]) -> str:
    """'device: weights 9.07 GiB, kv 2.00 GiB, hot 840.0 MiB, ...; host: ...', categories
    that hold bytes."""
    parts = []
    for where in ("device", "host"):
        held = [(k.split(".", 1)[1], v) for k, v in ledger.items() if k.startswith(where) and v]
        if held:
            parts.append(f"{where}: " + ", ".join(f"{k} {_size(v)}" for k, v in held))
    return "; ".join(parts) or "(no ledger)"


def _template(llama_model, override: str | None):
    from .chat_template import ChatTemplate
    from .qwen_template import QWEN_TEMPLATE

    if override:
        source = Path(override).read_text()
    else:
        source = llama_model.meta("tokenizer.chat_template") or QWEN_TEMPLATE
    return ChatTemplate(source, eos_token=llama_model.token_bytes(llama_model.eos).decode())


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


# the options _engine_options adds that _load takes, handed to the command as one dict
_ENGINE_KEYS = (
    "slots",
    "ctx",
    "batch_tokens",
    "prefill_batch_tokens",
    "prefill_policy",
    "max_waiting",
    "threads",
    "kv_type",
    "gpu_layers",
    "device",
    "kv_offload",
    "hot_blocks",
    "kv_host_type",
    "kv_hot_type",
    "gpu_memory",
    "sampling",
    "prefix_cache_gib",
    "prefix_cache_stride",
)


# EngineConfig's field names as the flags that set them
_FLAG_OF_FIELD = {
    "max_prefill_tokens": "--prefill-batch-tokens",
    "max_batch_tokens": "--batch-tokens",
    "n_slots": "--slots",
    "ctx_per_slot": "--ctx",
    "max_waiting": "--max-waiting",
}


def _in_flag_names(message: str) -> str:
    for field, flag in _FLAG_OF_FIELD.items():
        message = message.replace(field, flag)
    return message


def _engine_options(f):
    """The engine's options (and --chat-template) for serve and chat: the command receives the
    engine's as one `engine_options` dict, for `_load(model, **engine_options)`."""

    @functools.wraps(f)
    def command(**kw):
        return f(engine_options={k: kw.pop(k) for k in _ENGINE_KEYS}, **kw)

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
            "over every GPU).",
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
    engine_options,
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
    engine, llama_model, name = _load(model, **engine_options)
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
    engine_options,
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

    engine, llama_model, name = _load(model, **engine_options)
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
