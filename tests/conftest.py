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
