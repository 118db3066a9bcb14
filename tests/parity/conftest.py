"""Parity fixtures: one HF reference and one runtime per tiny model, and a summary of the
measured errors printed at the end of the run."""

import pytest

from .hf_reference import HFReference
from .llama_runtime import LlamaRuntime

RESULTS: list[str] = []

VARIANTS = {
    "tiny": ("tiny_hf_dir", "tiny_gguf"),
    "tiny_ple": ("tiny_ple_hf_dir", "tiny_ple_gguf"),
}


# how the QSA layers attend (LlamaRuntime's attn): pyqsa's positional path (the default), the
# mask-based sparse path, and upstream's dense attention under the selection mask
PATHS = ("positional", "sparse", "masked")

_hf_refs: dict[str, HFReference] = {}


@pytest.fixture(
    scope="module",
    params=[(v, p) for v in sorted(VARIANTS) for p in PATHS],
    ids=lambda vp: f"{vp[0]}-{vp[1]}",
)
def pair(request):
    variant, path = request.param
    hf_fixture, gguf_fixture = VARIANTS[variant]
    if variant not in _hf_refs:
        _hf_refs[variant] = HFReference(str(request.getfixturevalue(hf_fixture)))
    rt = LlamaRuntime(str(request.getfixturevalue(gguf_fixture)), n_ctx=512, n_seq=3, attn=path)
    yield f"{variant}/{path}", _hf_refs[variant], rt
    rt.close()


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.section("parity vs HF (f32)")
        for line in RESULTS:
            terminalreporter.write_line(line)
