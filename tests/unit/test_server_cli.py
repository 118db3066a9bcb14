"""`pyqsa serve --api-key-file`: the key comes from a file, and wrong use stops before loading.
Engine flags with bad values are one-line usage errors; `--device N` names a GPU."""

import itertools
import os

import pytest
from click.testing import CliRunner

import pyqsa.engine.runner
from pyqsa import native
from pyqsa.cli import main
from pyqsa.engine.runner import RunnerError

NO_ENV_KEY = {"PYQSA_API_KEY": None}


def test_key_file_and_key_together_are_refused(tmp_path):
    key = tmp_path / "key"
    key.write_text("k\n")
    args = ["serve", "--api-key", "k", "--api-key-file", str(key)]
    r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
    assert r.exit_code == 2 and "not both" in r.output
    r = CliRunner().invoke(main, ["serve", "--api-key-file", str(key)], env={"PYQSA_API_KEY": "k"})
    assert r.exit_code == 2 and "not both" in r.output


def test_empty_key_file_is_refused(tmp_path):
    key = tmp_path / "key"
    key.write_text(" \n")
    r = CliRunner().invoke(main, ["serve", "--api-key-file", str(key)], env=NO_ENV_KEY)
    assert r.exit_code == 2 and "holds no key" in r.output


def test_bad_engine_flags_are_one_line_errors():
    for args, what in (
        (["--kv-type", "q4_0"], "'--kv-type'"),
        (["--gpu-layers", "-1"], "'--gpu-layers'"),
        (["--prefill-policy", "lifo"], "'--prefill-policy'"),
        (["--default-max-tokens", "0"], "'--default-max-tokens'"),
        (["--kv-offload", "gpu"], "'--kv-offload'"),
        (["--kv-offload", ""], "'--kv-offload'"),
        (["--hot-blocks", "0"], "'--hot-blocks'"),
        (["--hot-blocks", "-3"], "'--hot-blocks'"),
        (["--hot-blocks", "eight"], "'--hot-blocks'"),
        (["--kv-host-type", "q4_0"], "'--kv-host-type'"),
        (["--device", "-1"], "'--device'"),
        (["--device", "gpu0"], "'--device'"),
        (["--device", ""], "'--device'"),
        (["--prefill-batch-tokens", "0"], "'--prefill-batch-tokens'"),
        (["--sampling", "gpu"], "'--sampling'"),
        (["--gpu-memory", "lots"], "'--gpu-memory'"),
        (["--gpu-memory", ""], "'--gpu-memory'"),
        (["--kv-hot-type", "q4_0"], "'--kv-hot-type'"),
    ):
        r = CliRunner().invoke(main, ["serve", *args], env=NO_ENV_KEY)
        assert r.exit_code == 2 and f"Invalid value for {what}" in r.output, r.output


def test_paging_flags_without_paging_are_usage_errors():
    for cmd, (flag, value) in itertools.product(
        ("serve", "chat"),
        (("--hot-blocks", "8"), ("--kv-host-type", "q8_0"), ("--kv-hot-type", "f16")),
    ):
        r = CliRunner().invoke(main, [cmd, "--kv-offload", "none", flag, value], env=NO_ENV_KEY)
        assert r.exit_code == 2, r.output
        errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
        assert errors == [f"Error: {flag} needs paging: --kv-offload host or auto, not none"]


def test_device_on_a_cpu_only_build_is_a_usage_error():
    if native.build_info().backend != "CPU":
        pytest.skip("a GPU build")
    for cmd in ("serve", "chat"):
        r = CliRunner().invoke(main, [cmd, "--device", "0"], env=NO_ENV_KEY)
        assert r.exit_code == 2, r.output
        errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
        assert errors == ["Error: --device 0: there is no GPU (a CPU-only build)"]
        assert "demo model" not in r.output  # refused before anything loads


def test_f16_hot_cache_needs_a_q8_0_store():
    for args in ([], ["--kv-type", "q8_0", "--kv-host-type", "f32"]):
        r = CliRunner().invoke(main, ["serve", "--kv-hot-type", "f16", *args], env=NO_ENV_KEY)
        assert r.exit_code == 2, r.output
        errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "needs a q8_0 host store" in errors[0], r.output


def test_gpu_memory_without_a_gpu_is_a_usage_error():
    if native.build_info().backend != "CPU":
        pytest.skip("a GPU build")
    r = CliRunner().invoke(main, ["serve", "--gpu-memory", "24"], env=NO_ENV_KEY)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: --gpu-memory needs a GPU build with layers on a GPU"]


def test_gpu_memory_refusals_on_a_fake_device(monkeypatch, tmp_path):
    """A fake GPU with 8 GiB free: a budget above it is refused before the weights load; weights
    that take 7 GiB of it (free drops to 1 GiB) do not fit a 6 GiB budget with the runtime's
    reserve, and the engine is never made."""
    import pyqsa.engine.paging

    monkeypatch.setenv("CUDA_MODULE_LOADING", "")  # serve's own choice below, undone after
    free = [8 * 2**30]
    monkeypatch.setattr(pyqsa.engine.paging, "device_free", lambda layers, device=None: free[0])
    monkeypatch.setattr(pyqsa.engine.paging, "gpu_devices", lambda: [_gpu("GPU0")])

    def load(path, gpu_layers=None, gpus=None, tensor_split=None, progress=None):
        free[0] = 2**30
        return object()

    monkeypatch.setattr(pyqsa.engine.runner, "LlamaModel", load)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    args = ["serve", str(gguf), "--kv-offload", "none", "--gpu-memory"]
    r = CliRunner().invoke(main, [*args, "24"], env=NO_ENV_KEY)
    assert r.exit_code == 2, r.output
    assert (
        "Error: Invalid value for '--gpu-memory': --gpu-memory 24 GiB: the GPU has only "
        "8.00 GiB free" in r.output
    )
    for value in ("0", "-1", "nan", "inf"):
        r = CliRunner().invoke(main, [*args, value], env=NO_ENV_KEY)
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert "Invalid value for '--gpu-memory'" in r.output, r.output
    assert free == [8 * 2**30]  # nothing loaded
    r = CliRunner().invoke(main, [*args, "6"], env=NO_ENV_KEY)
    assert r.exit_code == 1, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    # serve loads every kernel at start, so the reserve is the eager one
    assert os.environ["CUDA_MODULE_LOADING"] == "EAGER"
    assert errors == [
        "Error: the weights take 7.00 GiB of the device; with the CUDA runtime's 1.50 GiB that "
        "exceeds --gpu-memory 6.00 GiB (try --gpu-layers, or a quantized model: pyqsa quantize)"
    ]
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    free[0] = 8 * 2**30
    r = CliRunner().invoke(main, [*args, "6"], env=NO_ENV_KEY)
    assert "with the CUDA runtime's 1.00 GiB that exceeds --gpu-memory 6.00 GiB" in r.output


def _flags(**kw):
    """serve's engine flags at their defaults for a small engine, with `kw` over them."""
    from pyqsa.server.startup import EngineFlags

    small = dict(
        slots=1, ctx=64, batch_tokens=8, prefill_batch_tokens=None, prefill_policy="fair",
        max_waiting=1, threads=1, kv_type="f16", gpu_layers=None, device=None, gpus=None,
        tensor_split=None, kv_offload="none", hot_blocks=None, kv_host_type=None,
        kv_hot_type=None, gpu_memory=None, sampling="host", prefix_cache_gib=0.0,
        prefix_cache_stride=16384, prefix_cache_copy_ahead=1024,
    )  # fmt: skip
    return EngineFlags(**(small | kw))


def _gpu(name: str, type: str = "GPU") -> native.DeviceInfo:
    return native.DeviceInfo(name, f"NVIDIA {name}", type, 2**30, 2**31)


def test_device_names_a_gpu(monkeypatch, tmp_path):
    """An index among the GPU devices (llama.cpp's order, CPU and ACCEL devices left out):
    out of range, a one-line usage error naming them; in range, the model loads on it."""
    devices = [_gpu("GPU0"), _gpu("GPU1"), _gpu("CPU", "CPU"), _gpu("BLAS", "ACCEL")]
    monkeypatch.setattr(native, "devices", lambda: devices)
    loads = []

    def load(path, gpu_layers=None, gpus=None, tensor_split=None, progress=None):
        loads.append((gpu_layers, gpus, tensor_split))
        raise RunnerError("not loaded here")

    monkeypatch.setattr(pyqsa.engine.runner, "LlamaModel", load)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    r = CliRunner().invoke(main, ["serve", str(gguf), "--device", "2"], env=NO_ENV_KEY)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: Invalid value for '--device': 2: the GPUs here are 0 (NVIDIA GPU0), 1 (NVIDIA GPU1)"
    ]
    assert loads == []
    for cmd in ("serve", "chat"):
        args = [cmd, str(gguf), "--device", "1", "--gpu-layers", "3", "--kv-offload", "none"]
        r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
        assert r.exit_code == 1, r.output
        said = [f"pyqsa: loading {gguf} (0.0 MiB)", "Error: not loaded here"]
        assert r.output.splitlines() == said
    assert loads == [(3, (1,), None), (3, (1,), None)]
    # --gpus N is the same one GPU; several split the layers, by --tensor-split's shares
    loads.clear()
    for args in (["--gpus", "1"], ["--gpus", "1,0", "--tensor-split", "3,1"]):
        args = ["serve", str(gguf), *args, "--gpu-layers", "3", "--kv-offload", "none"]
        r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
        assert r.exit_code == 1 and "Error: not loaded here" in r.output, r.output
    assert loads == [(3, (1,), None), (3, (1, 0), (3.0, 1.0))]


def test_gpus_and_tensor_split_refuse_what_names_no_split_here(monkeypatch, tmp_path):
    """--gpus and --tensor-split are checked before anything loads: GPUs that are not here or
    named twice, --device beside --gpus, shares that are no numbers, negative or all 0, a
    count of shares other than the GPUs that split the layers, and a split of one GPU are
    one-line usage errors."""
    monkeypatch.setattr(native, "devices", lambda: [_gpu("GPU0"), _gpu("GPU1"), _gpu("CPU", "CPU")])
    loads = []
    monkeypatch.setattr(pyqsa.engine.runner, "LlamaModel", lambda *a, **k: loads.append(a))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    here = "the GPUs here are 0 (NVIDIA GPU0), 1 (NVIDIA GPU1)"
    for args, error in (
        (["--gpus", "0,2"], f"Invalid value for '--gpus': 0,2: {here}"),
        (["--gpus", "1,1"], "Invalid value for '--gpus': 1,1: a GPU named twice"),
        (["--gpus", "0;1"], "Invalid value for '--gpus': '0;1': GPU indices separated by commas"),
        (["--gpus", "-1"], "Invalid value for '--gpus': '-1': GPU indices are 0 or more"),
        (["--device", "0", "--gpus", "1"], "give --device or --gpus, not both"),
        (["--tensor-split", "1,x"], "Invalid value for '--tensor-split': '1,x': numbers"),
        (["--tensor-split", "1,-1"], "'1,-1': shares are 0 or more, not all 0"),
        (["--tensor-split", "0,0"], "'0,0': shares are 0 or more, not all 0"),
        (["--tensor-split", "nan,1"], "'nan,1': shares are 0 or more, not all 0"),
        (["--tensor-split", "1,1,1"], "Invalid value for '--tensor-split': 3 shares for 2 GPUs"),
        (["--gpus", "0,1", "--tensor-split", "1"], "1 shares for 2 GPUs"),
        (["--gpus", "1", "--tensor-split", "1"], "--tensor-split needs the layers split over 2"),
    ):
        for cmd in ("serve", "chat"):
            r = CliRunner().invoke(main, [cmd, str(gguf), *args], env=NO_ENV_KEY)
            assert r.exit_code == 2 and "Traceback" not in r.output, r.output
            errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1 and error in errors[0], r.output
    assert loads == []


def test_gpus_on_a_cpu_build_is_a_usage_error():
    r = CliRunner().invoke(main, ["serve", "--gpus", "0,1"], env=NO_ENV_KEY)
    assert r.exit_code == 2, r.output
    assert "Error: --gpus 0,1: there is no GPU (a CPU-only build)" in r.output


def test_engine_settings_that_do_not_fit_together_are_one_line_errors():
    for args, msg in (
        (["--batch-tokens", "2", "--slots", "8"], "--batch-tokens (2) must be >= --slots (8)"),
        (
            ["--batch-tokens", "16", "--prefill-batch-tokens", "8"],
            "--prefill-batch-tokens (8) must be >= --batch-tokens (16)",
        ),
    ):
        r = CliRunner().invoke(main, ["serve", *args], env=NO_ENV_KEY)
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output


def test_prefix_cache_flags_refuse_what_is_no_size():
    for cmd, (flag, value) in itertools.product(
        ("serve", "chat"),
        (
            ("--prefix-cache-gib", "-1"),
            ("--prefix-cache-gib", "-0.5"),
            ("--prefix-cache-gib", "lots"),
            ("--prefix-cache-gib", "nan"),
            ("--prefix-cache-gib", "inf"),
            ("--prefix-cache-stride", "0"),
            ("--prefix-cache-stride", "4K"),
            ("--prefix-cache-copy-ahead", "0"),
            ("--prefix-cache-copy-ahead", "-3"),
            ("--prefix-cache-copy-ahead", "4K"),
        ),
    ):
        r = CliRunner().invoke(main, [cmd, flag, value], env=NO_ENV_KEY)
        assert r.exit_code == 2 and f"Invalid value for '{flag}'" in r.output, r.output


def _fake_gpu(monkeypatch, compute) -> None:
    """A fake GPU with 8 GiB free, whose ledger adds to the CPU build's own (which holds no
    device bytes) `compute(real ledger, hot blocks)` bytes of compute and 1 MiB a hot block."""
    import pyqsa.engine.paging

    monkeypatch.setattr(pyqsa.engine.paging, "device_free", lambda layers, device=None: 8 * 2**30)
    monkeypatch.setattr(pyqsa.engine.paging, "gpu_devices", lambda: [_gpu("GPU0")])
    real_ledger = native.ledger

    def ledger(ctx):
        real, hot = real_ledger(ctx), native.paging_stats(ctx)["hot_blocks"]
        return real | {"device.compute": compute(real, hot), "device.hot": hot * 2**20}

    monkeypatch.setattr(native, "ledger", ledger)


def test_the_hot_cache_grows_into_the_budget_on_a_fake_device(monkeypatch, capsys):
    """With paging and no --hot-blocks, serve grows the hot cache into the room a first context
    leaves of --gpu-memory, up to a slot's whole context. A fake GPU: 8 GiB free, and a ledger
    that puts 4 GiB of compute and 1 MiB a hot block on the device (the CPU build's own ledger
    holds no device bytes)."""
    from pyqsa.server.startup import start_engine

    monkeypatch.setenv("CUDA_MODULE_LOADING", "")  # serve's own choice, undone after
    _fake_gpu(monkeypatch, lambda real, hot: 4 * 2**30)
    flags = _flags(
        slots=2, ctx=512, batch_tokens=64, max_waiting=4, kv_offload="host", gpu_memory=6.0
    )
    engine, _, _ = start_engine(None, flags)
    try:
        # 6 GiB less the 1.5 GiB reserve (kernels loaded at start) leaves ~0.5 GiB of room at 8
        # blocks: far more than the 128 blocks of a 512-token slot (the demo model's blocks hold
        # 4 tokens)
        assert engine.stats().paging["hot_blocks"] == 128
        assert engine.config.device_memory_limit == 6 * 2**30
    finally:
        engine.stop()
    err = capsys.readouterr().err
    assert "the hot cache grows from 8 to 128 blocks per slot and QSA layer" in err
    assert "device budget 6.00 GiB (--gpu-memory)" in err


def test_a_grown_hot_cache_over_the_budget_once_warmed_up_is_refitted(monkeypatch, capsys):
    """The first context's ledger misses what the engine's warm-up adds (a fake ledger: 512 MiB
    more in every context of a grown cache), so the grown cache goes over the budget; serve
    takes the bytes over (and a tenth more) off it in blocks and makes the engine again."""
    from pyqsa.server.startup import start_engine

    import pyqsa.engine.paging

    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")  # a 1 GiB reserve
    _fake_gpu(monkeypatch, lambda real, hot: 4 * 2**30 + (512 * 2**20 if hot > 8 else 0))
    closed = []  # the hot blocks of each context freed
    real_close = pyqsa.engine.runner.LlamaRunner.close

    def close(runner):
        if runner.ctx:
            closed.append(native.paging_stats(runner.ctx)["hot_blocks"])
        real_close(runner)

    monkeypatch.setattr(pyqsa.engine.runner.LlamaRunner, "close", close)
    flags = _flags(
        slots=2, ctx=8192, batch_tokens=64, max_waiting=4, kv_offload="host", gpu_memory=6.0
    )
    engine, _, _ = start_engine(None, flags)
    try:
        # 5 GiB usable; at 8 blocks 4 GiB + 8 MiB held: 8 + 0.9 of 1016 = 922 blocks, then
        # 4.5 GiB + 922 MiB held, 410 MiB over: 456 blocks off
        assert engine.stats().paging["hot_blocks"] == 466
        assert closed == [8, 922]  # the first context, then the overshooting engine's
    finally:
        engine.stop()
    err = capsys.readouterr().err
    assert "the hot cache grows from 8 to 922 blocks" in err
    assert (
        "922 hot blocks went over --gpu-memory 6.00 GiB once warmed up (compute +512.0 MiB "
        "beside the hot cache since the first context); 466 instead"
    ) in err


def test_the_first_context_holds_the_compute_of_device_sampling(monkeypatch, capsys):
    """Device samplers, attached to every slot, make llama.cpp reserve its compute buffers
    again at the first pass (2.5 times the demo model's compute at a row a slot). The first
    context makes a pass before its ledger is read, so the cache it grows fits once the engine
    has warmed up and no refit is needed. A fake GPU whose compute is 512 times the CPU
    build's (0.6 GiB before the first pass, 1.5 after)."""
    from pyqsa.server.startup import start_engine

    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")  # a 1 GiB reserve
    _fake_gpu(monkeypatch, lambda real, hot: 512 * real["host.compute"])
    flags = _flags(
        slots=2, ctx=8192, batch_tokens=64, max_waiting=4, kv_offload="host", gpu_memory=3.0,
        sampling="device",
    )  # fmt: skip
    engine, _, _ = start_engine(None, flags)
    try:
        held = sum(v for k, v in engine.stats().ledger.items() if k.startswith("device."))
        assert held <= 2 * 2**30  # 3 GiB less the reserve
        grown = engine.stats().paging["hot_blocks"]
    finally:
        engine.stop()
    err = capsys.readouterr().err
    assert f"the hot cache grows from 8 to {grown} blocks" in err
    assert "went over" not in err


def test_a_bad_cuda_stack_size_is_a_one_line_error():
    """PYQSA_CUDA_STACK_BYTES is read as the model loads, on any build."""
    for value in ("lots", "-1", "1.5", ""):
        env = {**NO_ENV_KEY, "PYQSA_CUDA_STACK_BYTES": value}
        r = CliRunner().invoke(main, ["serve"], env=env)
        assert r.exit_code == 1 and r.exception is not None, r.output
        assert f"PYQSA_CUDA_STACK_BYTES must be a whole number of bytes, got {value!r}" in r.output
        assert "Traceback" not in r.output


def test_the_start_line_says_where_the_layers_are(monkeypatch):
    """'pyqsa: layers on ...' on a (faked) GPU build: the GPUs that hold them by index and
    name, how several split them, and how many a --gpu-layers below the model's puts there
    (the CPU build's line: test_serve_on_the_cpu_says_so)."""
    from pyqsa.server.startup import _placement

    import pyqsa.engine.paging

    monkeypatch.setattr(pyqsa.engine.paging, "gpu_devices", lambda: [_gpu("A"), _gpu("B")])
    cases = (
        ({}, None, "GPU 0 (NVIDIA A) and GPU 1 (NVIDIA B), split by free memory"),
        ({"tensor_split": (3.0, 1.0)}, (1, 0), "GPU 1 (NVIDIA B) and GPU 0 (NVIDIA A), split 3:1"),
        ({"gpu_layers": 10}, (1,), "GPU 1 (NVIDIA B): 10 of 48, the rest on the CPU"),
    )
    for kw, gpus, said in cases:
        assert _placement(_flags(**kw), gpus, 48) == said


def test_serve_on_the_cpu_says_so(capsys):
    from pyqsa.server.startup import start_engine

    engine, _, _ = start_engine(None, _flags())
    engine.stop()
    assert "pyqsa: layers on the CPU\n" in capsys.readouterr().err
