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


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request):
    hf_fixture, gguf_fixture = VARIANTS[request.param]
    hf = HFReference(str(request.getfixturevalue(hf_fixture)))
    rt = LlamaRuntime(str(request.getfixturevalue(gguf_fixture)), n_ctx=512, n_seq=3)
    yield request.param, hf, rt
    rt.close()


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.section("parity vs HF (f32)")
        for line in RESULTS:
            terminalreporter.write_line(line)
