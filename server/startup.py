"""An engine started from `pyqsa serve`'s and `pyqsa chat`'s engine flags: the flags checked, the
device budget and the paging plan decided (before the weights load where they can be, against
what the weights leave where they cannot), the model loaded, the engine started and what it
holds said on stderr. Every refusal is a one-line click error naming the flag."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import click

from pyqsa.engine.runner import DEVICE_MAX_ADJUST


@dataclasses.dataclass(frozen=True)
class EngineFlags:
    """The engine's flags of serve and chat, as click parses them (server/cli.py)."""

    slots: int
    ctx: int
    batch_tokens: int
    prefill_batch_tokens: int | None
    prefill_policy: str
    max_waiting: int
    threads: int
    kv_type: str
    gpu_layers: int | None
    device: int | None
    gpus: tuple[int, ...] | None
    tensor_split: tuple[float, ...] | None
    kv_offload: str
    hot_blocks: int | None
    kv_host_type: str | None
    kv_hot_type: str | None
    gpu_memory: float | None
    sampling: str
    prefix_cache_gib: float | None
    prefix_cache_stride: int
    prefix_cache_copy_ahead: int

    def paging_flags(self) -> tuple[tuple[str, object], ...]:
        """The flags that only paging reads, with their values."""
        return (
            ("--hot-blocks", self.hot_blocks),
            ("--kv-host-type", self.kv_host_type),
            ("--kv-hot-type", self.kv_hot_type),
        )


# EngineConfig's field names as the flags that set them
_FLAG_OF_FIELD = {
    "max_prefill_tokens": "--prefill-batch-tokens",
    "max_batch_tokens": "--batch-tokens",
    "n_slots": "--slots",
    "ctx_per_slot": "--ctx",
    "max_waiting": "--max-waiting",
}


def start_engine(model: str | None, flags: EngineFlags):
    """(engine, LlamaModel, model name) on MODEL (the embedded demo model when None)."""
    from pyqsa.engine import device_budget, load_engine, paging
    from pyqsa.engine.runner import RunnerError

    device_budget.load_kernels_at_start()
    paged_type = _paged_kv_type(flags)
    gpus = _held_gpus(flags)
    free_at_start, budget = _device_budget(flags, gpus)
    gpu = free_at_start is not None  # a GPU build, layers on a GPU
    # the sample op's per-sequence draws cost a GPU less than the logits' round trip, and a CPU
    # more than drawing rows in parallel on the host (bench/README.md, 2026-12-01)
    on_device = flags.sampling == "device" or (flags.sampling == "auto" and gpu)
    path, name = _model_path(model)
    config = _engine_config(path, flags, gpus, on_device)
    if gpu and flags.hot_blocks is not None and flags.hot_blocks > paging.MAX_HOT_BLOCKS_GPU:
        raise click.UsageError(
            f"--hot-blocks {flags.hot_blocks}: a GPU takes at most {paging.MAX_HOT_BLOCKS_GPU}"
        )
    n_tokens = flags.slots * flags.ctx
    kv = None  # the model's QSA K/V geometry, read where paging may be on
    if (
        flags.kv_offload == "host"
        or flags.hot_blocks is not None
        or (flags.kv_offload == "auto" and gpu)
    ):
        kv = _qsa_kv(path, flags.hot_blocks)
    # what can be refused is refused before the weights load; auto on a GPU decides after,
    # against the device memory they left free
    plan = None
    if flags.kv_offload == "host":
        plan = _paging_plan(kv, "host", flags.hot_blocks, n_tokens, paged_type, None)
    elif flags.kv_offload == "none" or not gpu:
        plan = paging.PagingPlan(0, 0)
    try:
        llama_model = _load_model(path, flags.gpu_layers, gpus, flags.tensor_split)
        room = None  # the device memory free now that the budget leaves the K/V
        if budget is not None:
            free_now = paging.device_free(flags.gpu_layers, gpus)
            weights = free_at_start - free_now
            budget.check_weights(weights)
            room = min(free_now, budget.kv_room(weights))
        if plan is None:  # auto on a GPU, so with a budget
            plan = _paging_plan(kv, "auto", flags.hot_blocks, n_tokens, paged_type, room)
        unused = [f for f, v in flags.paging_flags() if v]
        if unused and not plan.hot_blocks:
            click.echo(
                "pyqsa: --kv-offload auto keeps the K/V on the device (no GPU, or they fit): "
                f"{' and '.join(unused)} unused; --kv-offload host pages anyway",
                err=True,
            )
        config = dataclasses.replace(
            config,
            hot_blocks=plan.hot_blocks,
            kv_type=paged_type if plan.hot_blocks else flags.kv_type,
            kv_hot_type=flags.kv_hot_type if plan.hot_blocks else None,
            prefix_cache_bytes=_prefix_budget(flags.prefix_cache_gib, plan),
            device_memory_limit=budget.limit if budget is not None else 0,
        )
        first = None  # (hot blocks, ledger) of the first context, where the cache grew
        if budget is not None and plan.hot_blocks and flags.hot_blocks is None:
            most = min(paging.MAX_HOT_BLOCKS_GPU, -(-flags.ctx // kv.ratio))
            config, first = _grow_hot_cache(llama_model, config, budget, most)
        engine, llama_model = load_engine(config, llama_model)
        if first is not None and config.hot_blocks > first[0]:
            engine, llama_model = _refit_hot_cache(engine, llama_model, budget, first)
        if budget is not None:
            try:
                budget.check(engine.stats().ledger)
            except device_budget.BudgetError:
                engine.stop()
                raise
    except (RunnerError, device_budget.BudgetError) as e:
        raise click.ClickException(str(e)) from None
    where = _placement(flags, gpus, llama_model.n_layer) if gpu else "the CPU"
    click.echo(f"pyqsa: layers on {where}", err=True)
    _say_started(engine, flags, budget, plan, on_device)
    return engine, llama_model, name


def _paged_kv_type(flags: EngineFlags) -> str:
    """The K/V type of a paged context's host store; paging's flags without paging, and an f16
    hot cache over anything but a q8_0 store, are usage errors."""
    for flag, value in flags.paging_flags():
        if flags.kv_offload == "none" and value is not None:
            raise click.UsageError(f"{flag} needs paging: --kv-offload host or auto, not none")
    # with paging every QSA layer's K/V is in the host store, and the hot cache holds copies of
    # its blocks, so the store's type is the K/V type
    paged_type = flags.kv_host_type or flags.kv_type
    if flags.kv_hot_type is not None and paged_type != "q8_0":
        raise click.UsageError(
            f"--kv-hot-type {flags.kv_hot_type} needs a q8_0 host store (--kv-host-type q8_0), "
            f"not {paged_type}"
        )
    return paged_type


def _held_gpus(flags: EngineFlags) -> tuple[int, ...] | None:
    """The GPUs that hold the layers: --device N (one), --gpus (one or several) or None (every
    GPU); a GPU that is not here, both flags, or a --tensor-split that does not give each GPU
    of a split one share, are usage errors naming the GPUs."""
    from pyqsa.engine.paging import gpu_devices

    if flags.device is not None and flags.gpus is not None:
        raise click.UsageError("give --device or --gpus, not both")
    gpus = (flags.device,) if flags.device is not None else flags.gpus
    if gpus is not None:
        flag = "--device" if flags.device is not None else "--gpus"
        _check_gpus(gpus, flag)
    if flags.tensor_split is not None:
        n = len(gpus) if gpus is not None else len(gpu_devices())
        if n < 2:
            raise click.UsageError(
                f"--tensor-split needs the layers split over 2 or more GPUs; {n} here hold them"
            )
        if len(flags.tensor_split) != n:
            raise click.BadParameter(
                f"{len(flags.tensor_split)} shares for {n} GPUs", param_hint="'--tensor-split'"
            )
    return gpus


def _device_budget(flags: EngineFlags, gpus: tuple[int, ...] | None):
    """(device memory free at start, DeviceBudget): (None, None) without a GPU build with layers
    on a GPU, where --gpu-memory is a usage error."""
    from pyqsa.engine import device_budget, paging

    free_at_start = paging.device_free(flags.gpu_layers, gpus)
    if free_at_start is None:
        if flags.gpu_memory is not None:
            raise click.UsageError("--gpu-memory needs a GPU build with layers on a GPU")
        return None, None
    n_devices = len(gpus) if gpus is not None else len(paging.gpu_devices())
    try:
        return free_at_start, device_budget.DeviceBudget.of(
            flags.gpu_memory, free_at_start, n_devices
        )
    except device_budget.BudgetError as e:
        raise click.BadParameter(str(e), param_hint="'--gpu-memory'") from None


def _model_path(model: str | None) -> tuple[str, str]:
    """(the GGUF's path, the model's name): the embedded demo model, said on stderr, when None."""
    from pyqsa.demo_model import demo_model_path

    if model is None:
        click.echo(
            "pyqsa: no model given, using the embedded demo model (random weights)", err=True
        )
        return str(demo_model_path()), "pyqsa-demo"
    return model, Path(model).name.removesuffix(".gguf")


def _engine_config(path: str, flags: EngineFlags, gpus: tuple[int, ...] | None, on_device: bool):
    """The EngineConfig of the flags before paging is decided; settings that do not fit
    together are a usage error in the flags' names."""
    from pyqsa.engine import EngineConfig

    try:
        return EngineConfig(
            path,
            n_slots=flags.slots,
            ctx_per_slot=flags.ctx,
            max_batch_tokens=flags.batch_tokens,
            max_prefill_tokens=flags.prefill_batch_tokens or 0,
            prefill_policy=flags.prefill_policy,
            max_waiting=flags.max_waiting,
            n_threads=flags.threads,
            kv_type=flags.kv_type,
            gpu_layers=flags.gpu_layers,
            gpus=gpus,
            tensor_split=flags.tensor_split,
            sample_on_device=on_device,
            prefix_stride=flags.prefix_cache_stride,
            prefix_rows_ahead=flags.prefix_cache_copy_ahead,
        )
    except ValueError as e:
        message = str(e)
        for field, flag in _FLAG_OF_FIELD.items():
            message = message.replace(field, flag)
        raise click.UsageError(message) from None


def _placement(flags: EngineFlags, gpus: tuple[int, ...] | None, n_layer: int) -> str:
    """Where the layers are on a GPU build with layers on a GPU: 'GPU 0 (NVIDIA H200)', or
    several GPUs and how they split the layers; with --gpu-layers below the model's, how many
    are on the GPUs."""
    from pyqsa.engine.paging import gpu_devices

    here = gpu_devices()
    held = gpus if gpus is not None else tuple(range(len(here)))
    where = " and ".join(f"GPU {i} ({here[i].description or here[i].name})" for i in held)
    if len(held) > 1:
        shares = flags.tensor_split
        where += ", split " + (":".join(f"{v:g}" for v in shares) if shares else "by free memory")
    if flags.gpu_layers is not None and flags.gpu_layers < n_layer:
        return f"{where}: {flags.gpu_layers} of {n_layer}, the rest on the CPU"
    return where


def _say_started(engine, flags: EngineFlags, budget, plan, on_device: bool) -> None:
    """What the started engine holds and how it samples, a line each on stderr."""
    from pyqsa.engine import device_budget

    stats, config = engine.stats(), engine.config
    click.echo(f"pyqsa: memory {_ledger_line(stats.ledger)}", err=True)
    if budget is not None:
        held = sum(device_budget.device_bytes(stats.ledger).values())
        click.echo(
            f"pyqsa: device budget {_size(budget.limit)} "
            f"({'--gpu-memory' if flags.gpu_memory is not None else 'free at start'}): the "
            f"ledger holds {_size(held)}, the CUDA runtime's reserve {_size(budget.reserve)} "
            f"(CUDA_MODULE_LOADING={device_budget.kernel_loading()})",
            err=True,
        )
    if stats.paging is not None:
        store = stats.ledger.get("host.kv") or plan.kv_bytes
        click.echo(
            f"pyqsa: paging: hot cache {stats.paging['hot_blocks']} blocks per slot and QSA "
            f"layer; host store {_size(store)} ({config.kv_type} K/V of {flags.slots} x "
            f"{flags.ctx} tokens)",
            err=True,
        )
    if config.prefix_cache_bytes:
        click.echo(
            f"pyqsa: prefix cache: up to {_size(config.prefix_cache_bytes)} of host memory, "
            f"snapshots where prompts and replies end and every {flags.prefix_cache_stride} "
            "prompt tokens",
            err=True,
        )
    else:
        click.echo("pyqsa: prefix cache: off", err=True)
    chosen = f"{flags.sampling}: " if flags.sampling == "auto" else ""
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


def _grow_hot_cache(llama_model, config, budget, most: int):
    """(config with the hot cache grown into the device memory a first context of its
    hot_blocks leaves of the budget (engine/device_budget.py), said on stderr; (its hot blocks,
    its ledger)). That context is freed before the engine's is made."""
    from pyqsa.engine.runner import LlamaRunner
    from pyqsa.engine.start import warm_up

    probe = LlamaRunner(llama_model, config)
    try:
        # NOTE: attaching the slots' device samplers makes llama.cpp reserve its compute buffers
        # again at the next pass, for the sampling graphs too (2.5 times the demo model's
        # compute on the CPU): a one-token pass makes the ledger hold what the engine's will
        warm_up(probe, llama_model.eos)
        ledger = probe.ledger()
    finally:
        probe.close()
    budget.check(ledger)
    first = (config.hot_blocks, ledger)
    grown = budget.grown_hot_blocks(ledger, config.hot_blocks, most)
    if grown > config.hot_blocks:
        click.echo(
            f"pyqsa: paging: the hot cache grows from {config.hot_blocks} to {grown} blocks per "
            f"slot and QSA layer, into the room {budget.flag} leaves (--hot-blocks sets it)",
            err=True,
        )
        config = dataclasses.replace(config, hot_blocks=grown)
    return config, first


def _refit_hot_cache(engine, llama_model, budget, first: tuple[int, dict[str, int]]):
    """(engine, llama_model): the engine, or, where its grown hot cache went over the budget
    once warmed up, one made again with the blocks refit_hot_blocks leaves; what grew beside
    the hot cache since the first context (`first`: its hot blocks, its ledger) said on stderr,
    since that is what the first context did not foretell."""
    from pyqsa.engine import device_budget, load_engine

    config, ledger = engine.config, engine.stats().ledger
    fitted = budget.refit_hot_blocks(ledger, config.hot_blocks, first[0])
    if fitted == config.hot_blocks:
        return engine, llama_model
    engine.stop()
    engine.runner.close()  # its device memory and host store, before the next
    before, after = device_budget.device_bytes(first[1]), device_budget.device_bytes(ledger)
    grew = [
        f"{device_budget.LEDGER_NAMES.get(k, k)} +{_size(v - before.get(k, 0))}"
        for k, v in after.items()
        if k != "hot" and v > before.get(k, 0)
    ]
    click.echo(
        f"pyqsa: paging: {config.hot_blocks} hot blocks went over {budget.flag} once warmed up "
        f"({', '.join(grew) or 'nothing'} beside the hot cache since the first context); "
        f"{fitted} instead",
        err=True,
    )
    return load_engine(dataclasses.replace(config, hot_blocks=fitted), llama_model)


def _check_gpus(gpus: tuple[int, ...], flag: str) -> None:
    """`flag`'s GPUs are indices among the GPU devices (llama.cpp's order), each once; anything
    else is a one-line usage error naming the GPUs here."""
    from pyqsa import native
    from pyqsa.engine.paging import gpu_devices

    here = gpu_devices()
    value = ",".join(map(str, gpus))
    if not here:
        where = "a CPU-only build" if native.build_info().backend == "CPU" else "none found"
        raise click.UsageError(f"{flag} {value}: there is no GPU ({where})")
    if len(set(gpus)) < len(gpus):
        raise click.BadParameter(f"{value}: a GPU named twice", param_hint=f"'{flag}'")
    if max(gpus) >= len(here):
        names = ", ".join(f"{i} ({d.description or d.name})" for i, d in enumerate(here))
        raise click.BadParameter(f"{value}: the GPUs here are {names}", param_hint=f"'{flag}'")


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


def _prefix_budget(gib: float | None, plan) -> int:
    """--prefix-cache-gib in bytes, beside the paging host store in the host memory free now."""
    from pyqsa.engine import paging, prefix_cache

    reserved = plan.kv_bytes if plan.hot_blocks else 0
    try:
        return prefix_cache.budget(gib, paging.host_available(), reserved)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--prefix-cache-gib'") from None


def _load_model(
    path: str,
    gpu_layers: int | None,
    gpus: tuple[int, ...] | None,
    tensor_split: tuple[float, ...] | None,
):
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
            path,
            gpu_layers,
            gpus,
            tensor_split,
            progress=lambda f: bar.update(int(100 * f) - bar.n),
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
