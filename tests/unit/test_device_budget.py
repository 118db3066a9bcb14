"""The device budget's arithmetic (engine/device_budget.py) on fake figures: the limit, the
refusals naming each category, and the hot cache grown into the room a first context leaves."""

import pytest

from pyqsa.engine import device_budget
from pyqsa.engine.device_budget import EAGER_RESERVE, LAZY_RESERVE, BudgetError, DeviceBudget

GiB = 2**30


@pytest.fixture(autouse=True)
def lazy_kernels(monkeypatch):
    """The figures below are CUDA's default: kernels loaded as they first run."""
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")


def _ledger(**device: int) -> dict[str, int]:
    return {f"device.{k}": v for k, v in device.items()} | {"host.kv": 48 * GiB}


def test_the_limit_is_the_flag_per_device_or_what_is_free():
    assert DeviceBudget.of(None, 30 * GiB).limit == 30 * GiB
    assert DeviceBudget.of(24, 139 * GiB).limit == 24 * GiB
    assert DeviceBudget.of(24, 100 * GiB, n_devices=2).limit == 48 * GiB
    assert DeviceBudget.of(24, 139 * GiB).usable == 24 * GiB - LAZY_RESERVE
    for value in (0, -1, float("nan"), float("inf")):
        with pytest.raises(BudgetError, match="must be above 0"):
            DeviceBudget.of(value, 139 * GiB)
    with pytest.raises(BudgetError, match="has only 20.00 GiB free"):
        DeviceBudget.of(24, 20 * GiB)


def test_weights_and_a_context_that_do_not_fit_are_refused_with_their_figures():
    budget = DeviceBudget.of(24, 139 * GiB)
    budget.check_weights(23 * GiB - LAZY_RESERVE)
    with pytest.raises(BudgetError, match="the weights take 23.50 GiB"):
        budget.check_weights(int(23.5 * GiB))
    assert budget.kv_room(9 * GiB) == 14 * GiB
    assert budget.kv_room(30 * GiB) == 0
    fits = _ledger(weights=9 * GiB, indexer=3 * GiB, compute=3 * GiB, hot=GiB, kv=0)
    budget.check(fits)
    over = _ledger(weights=9 * GiB, indexer=3 * GiB, compute=3 * GiB, hot=GiB, kv=8 * GiB)
    with pytest.raises(BudgetError) as e:
        budget.check(over)
    assert str(e.value).startswith(
        "this setting needs 25.00 GiB of the device (weights 9.00 GiB + K/V 8.00 GiB + block "
        "keys 3.00 GiB + compute 3.00 GiB + hot cache 1.00 GiB + CUDA runtime 1.00 GiB), over "
        "--gpu-memory 24.00 GiB"
    )


def test_the_hot_cache_grows_into_the_room_left_within_its_cap():
    budget = DeviceBudget.of(24, 139 * GiB)
    # 17 GiB held, 64 blocks of 16 MiB each: 6 GiB of room, 0.9 of it is 345 more blocks
    first = _ledger(weights=9 * GiB, indexer=3 * GiB, compute=4 * GiB, hot=GiB)
    assert budget.grown_hot_blocks(first, 64, 8192) == 64 + int(0.9 * 6 * GiB / (16 * 2**20))
    assert budget.grown_hot_blocks(first, 64, 100) == 100
    full = _ledger(weights=9 * GiB, indexer=3 * GiB, compute=10 * GiB, hot=GiB)
    assert budget.grown_hot_blocks(full, 64, 8192) == 64
    assert budget.grown_hot_blocks(_ledger(weights=9 * GiB), 64, 8192) == 64


def test_the_reserve_follows_when_cuda_loads_the_kernels(monkeypatch):
    assert DeviceBudget.of(24, 139 * GiB).reserve == LAZY_RESERVE == GiB
    monkeypatch.setenv("CUDA_MODULE_LOADING", " eager")
    budget = DeviceBudget.of(24, 139 * GiB)
    assert budget.reserve == EAGER_RESERVE == int(1.5 * GiB)
    assert budget.usable == int(22.5 * GiB)
    with pytest.raises(BudgetError, match=r"\+ CUDA runtime 1\.50 GiB\), over --gpu-memory 24"):
        budget.check(_ledger(weights=9 * GiB, indexer=3 * GiB, compute=3 * GiB, hot=10 * GiB))
    monkeypatch.delenv("CUDA_MODULE_LOADING")
    assert device_budget.kernel_loading() == "LAZY"  # CUDA's own default
    assert DeviceBudget.of(24, 139 * GiB).reserve == LAZY_RESERVE


def test_serving_loads_every_kernel_at_start_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("CUDA_MODULE_LOADING")
    device_budget.load_kernels_at_start()
    assert device_budget.kernel_loading() == "EAGER"
    monkeypatch.setenv("CUDA_MODULE_LOADING", "")  # set but empty: CUDA's default, so ours
    device_budget.load_kernels_at_start()
    assert device_budget.kernel_loading() == "EAGER"
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    device_budget.load_kernels_at_start()
    assert device_budget.kernel_loading() == "LAZY"


def test_a_grown_cache_over_the_limit_once_warmed_up_is_refitted():
    budget = DeviceBudget.of(24, 139 * GiB)  # 23 GiB usable
    # 8192 blocks of 1 MiB: 24.5 GiB held, 1.5 GiB over; 1.5 / 0.9 GiB of blocks taken off
    warmed = _ledger(weights=9 * GiB, indexer=3 * GiB, compute=int(4.5 * GiB), hot=8 * GiB)
    assert budget.refit_hot_blocks(warmed, 8192, 1024) == 8192 - -(-1536 // 0.9) == 6485
    assert budget.refit_hot_blocks(warmed, 8192, 7000) == 7000  # never below the first cache
    fits = _ledger(weights=9 * GiB, indexer=3 * GiB, compute=4 * GiB, hot=6 * GiB)
    assert budget.refit_hot_blocks(fits, 6144, 1024) == 6144
