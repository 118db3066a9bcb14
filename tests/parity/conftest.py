"""Parity fixtures: one HF reference and one runtime per tiny model, and a summary of the
measured errors printed at the end of the run."""

import os

import pytest

from .hf_reference import HFReference
from .llama_runtime import LlamaRuntime

RESULTS: list[str] = []

VARIANTS = {
    "tiny": ("tiny_hf_dir", "tiny_gguf"),
    "tiny_ple": ("tiny_ple_hf_dir", "tiny_ple_gguf"),
}


_hf_refs: dict[str, HFReference] = {}


def _open(request, variant: str, path: str, kv_type: str = "f32"):
    hf_fixture, gguf_fixture = VARIANTS[variant]
    if variant not in _hf_refs:
        _hf_refs[variant] = HFReference(str(request.getfixturevalue(hf_fixture)))
    rt = LlamaRuntime(
        str(request.getfixturevalue(gguf_fixture)), n_ctx=512, n_seq=3, attn=path, kv_type=kv_type
    )
    suffix = "" if kv_type == "f32" else f" {kv_type} KV"
    return f"{variant}/{path}{suffix}", _hf_refs[variant], rt


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request):
    """pyqsa's default path (positional) on each tiny model: every parity test runs on it."""
    name, hf, rt = _open(request, request.param, "positional")
    yield name, hf, rt
    rt.close()


# the other ways the QSA layers can attend, kept for comparison: the selection mask of
# upstream's per-step pooling with pyqsa's sparse attention, and upstream's dense attention
# under that mask
@pytest.fixture(scope="module", params=["sparse", "masked"])
def other_path(request):
    if request.param == "masked" and int(os.environ.get("PYQSA_TEST_N_GPU_LAYERS", "0")) > 0:
        # fattn.cu converts f32 K/V to f16 for every kernel it has: not an f32 check on CUDA
        pytest.skip("upstream's CUDA flash attention rounds f32 K/V to f16")
    name, hf, rt = _open(request, "tiny_ple", request.param)
    yield name, hf, rt
    rt.close()


# the quantized KV caches a server would run with, on pyqsa's path
@pytest.fixture(scope="module", params=["f16", "q8_0"])
def quantized_kv(request):
    name, hf, rt = _open(request, "tiny_ple", "positional", kv_type=request.param)
    yield request.param, name, hf, rt
    rt.close()


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.section("parity vs HF (f32)")
        for line in RESULTS:
            terminalreporter.write_line(line)
