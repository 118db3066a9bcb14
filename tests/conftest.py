"""Suite-wide checks: a run in which no test passed is a failure, never a green run."""

import pytest

_passed = 0


def pytest_runtest_logreport(report):
    global _passed
    if report.when == "call" and report.passed:
        _passed += 1


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == pytest.ExitCode.OK and _passed == 0:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


# Tiny Qwen4-Exp models (tests/models.py): HF checkpoints cached across runs under
# .build/test-models/<factory hash>, GGUF conversions once per session.
@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory):
    from models import cached_checkpoint

    return cached_checkpoint("tiny", ple=False, fallback_root=tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def tiny_ple_hf_dir(tmp_path_factory):
    from models import cached_checkpoint

    return cached_checkpoint("tiny-ple", ple=True, fallback_root=tmp_path_factory.mktemp("hf"))


def _convert(hf_dir, out):
    from pyqsa.convert import convert_checkpoint

    return convert_checkpoint(hf_dir, out, "f32", progress=False)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_hf_dir, tmp_path_factory):
    """tiny_hf_dir converted by pyqsa convert (f32, weight-estimated KV scales)."""
    return _convert(tiny_hf_dir, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf")


@pytest.fixture(scope="session")
def tiny_ple_gguf(tiny_ple_hf_dir, tmp_path_factory):
    """tiny_ple_hf_dir converted by pyqsa convert (f32, weight-estimated KV scales)."""
    return _convert(tiny_ple_hf_dir, tmp_path_factory.mktemp("gguf") / "tiny-ple-f32.gguf")


@pytest.fixture(scope="module")
def demo_llama(tmp_path_factory):
    """(path, LlamaModel) of the embedded demo model, loaded once per module."""
    from pyqsa.demo_model import demo_model_path
    from pyqsa.engine.runner import LlamaModel

    path = str(demo_model_path(tmp_path_factory.mktemp("demo")))
    model = LlamaModel(path)
    yield path, model
    model.close()
