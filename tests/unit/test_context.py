"""pyqsa.engine.context: the QSA mode is a setting of each llama context, not of the process."""

from __future__ import annotations

import ctypes

import llama_cpp
import pytest

from pyqsa import native
from pyqsa.debug import TensorCapture
from pyqsa.engine.context import ContextConfig, load_model, open_context


@pytest.fixture(scope="module")
def model(tiny_gguf):
    llama_cpp.llama_backend_init()
    m = load_model(str(tiny_gguf), gpu_layers=0)
    yield m
    llama_cpp.llama_model_free(m)


def graph_names(model, mode: str) -> set[str]:
    """The QSA tensor kinds the graph of a `mode` context computes in one decode."""
    seen: set[str] = set()
    cap = TensorCapture(r"qsa_(cells|mask)-\d+", lambda name, _t: seen.add(name.split("-")[0]))
    cfg = ContextConfig(ctx_per_seq=256, n_batch=64, n_threads=2, qsa_mode=mode)
    ctx = open_context(model, cfg, cb_eval=cap.callback)
    try:
        assert native.context_qsa_mode(ctx) == mode
        toks = (llama_cpp.llama_token * 40)(*range(100, 140))
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(toks, 40)) == 0
        cap.raise_pending()
    finally:
        llama_cpp.llama_free(ctx)
    return seen


def test_each_context_runs_its_own_qsa_mode(model):
    # positional selects cells directly; sparse and masked build a selection mask first
    assert graph_names(model, "positional") == {"qsa_cells"}
    assert graph_names(model, "masked") == {"qsa_mask"}
    assert graph_names(model, "sparse") == {"qsa_mask"}
    assert graph_names(model, "positional") == {"qsa_cells"}  # nothing process-wide was left


def test_a_context_made_without_settings_gets_the_defaults(model):
    ctx = llama_cpp.llama_init_from_model(model, llama_cpp.llama_context_default_params())
    try:
        assert native.context_qsa_mode(ctx) == "positional"
    finally:
        llama_cpp.llama_free(ctx)


def test_bad_settings_are_refused(model):
    with pytest.raises(ValueError, match="qsa_mode must be one of"):
        ContextConfig(qsa_mode="dense")
    with pytest.raises(ValueError, match="kv_type must be one of"):
        ContextConfig(kv_type="q4_0")
    ffi, lib = native.raw()
    cfg = ffi.new("pyqsa_context_config *", {"qsa_mode": 7})
    err = ffi.new("int32_t *")
    params = llama_cpp.llama_context_default_params()
    ctx = lib.pyqsa_init_from_model(
        ffi.cast("void *", model), ffi.cast("void *", ctypes.addressof(params)), cfg, err
    )
    assert ctx == ffi.NULL and err[0] == lib.PYQSA_ERR_INVALID_ARG
    out = ffi.new("pyqsa_context_config *")
    assert lib.pyqsa_context_config_get(ffi.NULL, out) == lib.PYQSA_ERR_INVALID_ARG


def test_ledger_splits_a_context_by_category(model):
    def held(ctx_per_seq: int) -> dict[str, int]:
        cfg = ContextConfig(n_seqs=2, ctx_per_seq=ctx_per_seq, n_batch=64, n_threads=2)
        ctx = open_context(model, cfg)
        try:
            return native.ledger(ctx)
        finally:
            llama_cpp.llama_free(ctx)

    small, large = held(256), held(1024)
    # a CPU model: everything on the host; the indexed layers' K/V and indexer rows scale with
    # the cells, the weights and the recurrent state (one per sequence) do not
    assert all(v == 0 for k, v in small.items() if k.startswith("device."))
    assert small["device.pool"] == small["host.pool"] == 0  # ggml's CUDA memory pools only
    assert small["device.stack"] == small["host.stack"] == 0  # CUDA's thread stacks only
    for part in ("weights", "kv", "indexer", "recurrent", "compute"):
        assert small[f"host.{part}"] > 0, part
    assert large["host.kv"] == 4 * small["host.kv"]
    assert large["host.indexer"] == 4 * small["host.indexer"]
    assert large["host.weights"] == small["host.weights"]
    assert large["host.recurrent"] == small["host.recurrent"]


def test_kv_type_sets_the_indexed_layers_cache(model):
    def kv_bytes(kv_type: str) -> int:
        cfg = ContextConfig(ctx_per_seq=256, n_batch=64, n_threads=2, kv_type=kv_type)
        ctx = open_context(model, cfg)
        try:
            return native.ledger(ctx)["host.kv"]
        finally:
            llama_cpp.llama_free(ctx)

    f16, q8 = kv_bytes("f16"), kv_bytes("q8_0")
    assert kv_bytes("f32") == 2 * f16
    assert q8 * 64 == f16 * 34  # q8_0: 34 bytes per 32 values, f16: 64


def test_loading_reports_its_progress(tiny_gguf):
    seen: list[float] = []
    m = load_model(str(tiny_gguf), gpu_layers=0, progress=seen.append)
    llama_cpp.llama_model_free(m)
    assert seen and seen == sorted(seen) and seen[-1] == 1.0


def test_a_failing_progress_display_does_not_stop_the_load(tiny_gguf):
    calls = []

    def broken(fraction: float) -> None:
        calls.append(fraction)
        raise RuntimeError("display gone")

    m = load_model(str(tiny_gguf), gpu_layers=0, progress=broken)
    assert m and calls[-1] == 1.0  # every call came, none stopped the load
    llama_cpp.llama_model_free(m)


def test_cuda_stack_reserve_without_cuda():
    """On a CPU build there are no CUDA stacks: the call says so instead of failing, and the
    model's load (which calls it for the GPUs that hold layers) goes on."""
    if native.build_info().backend != "CPU":
        pytest.skip("a CUDA build reserves (tests/gpu)")
    assert native.cuda_stack_reserve(0, 1160) is False


def test_the_gpus_that_hold_the_layers_fill_the_model_params():
    """One GPU holds the whole model (split mode none, main_gpu); several split the layers over
    themselves alone (the model's device list, in the order given) with --tensor-split's
    shares; none keeps llama.cpp's default (every GPU), shares included. The device handles
    are faked: a CPU build has no GPU."""
    from pyqsa.engine.context import set_gpus

    handles = [0x1000, 0x2000, 0x3000]
    p = llama_cpp.llama_model_default_params()
    assert set_gpus(p, (2,), None, lambda: handles) == []
    assert (p.split_mode, p.main_gpu, p.devices) == (llama_cpp.LLAMA_SPLIT_MODE_NONE, 2, None)

    p = llama_cpp.llama_model_default_params()
    keep = set_gpus(p, (2, 0), (3.0, 1.0), lambda: handles)
    devices = ctypes.cast(p.devices, ctypes.POINTER(ctypes.c_void_p))
    assert [devices[i] for i in range(3)] == [0x3000, 0x1000, None]
    assert (p.split_mode, p.main_gpu) == (llama_cpp.LLAMA_SPLIT_MODE_LAYER, 0)
    assert [p.tensor_split[i] for i in range(2)] == [3.0, 1.0] and len(keep) == 2

    p = llama_cpp.llama_model_default_params()
    default_mode = p.split_mode
    set_gpus(p, None, (1.0, 1.0, 2.0), lambda: handles)
    assert p.devices is None and p.split_mode == default_mode
    assert [p.tensor_split[i] for i in range(3)] == [1.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"gpus": ()}, "gpus must be distinct GPU indices >= 0"),
        ({"gpus": (0, 0)}, "gpus must be distinct GPU indices >= 0"),
        ({"gpus": (-1,)}, "gpus must be distinct GPU indices >= 0"),
        ({"tensor_split": (0.0, 0.0)}, "tensor_split must be shares >= 0, not all 0"),
        ({"tensor_split": (1.0, -1.0)}, "tensor_split must be shares >= 0, not all 0"),
        ({"gpus": (0, 1), "tensor_split": (1.0,)}, "tensor_split has 1 shares for 2 gpus"),
    ],
)
def test_engine_config_refuses_gpus_that_split_nothing(kw, error):
    from pyqsa.engine import EngineConfig

    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        EngineConfig("m.gguf", **kw)
