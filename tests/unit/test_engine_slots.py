from pyqsa.engine.slots import SlotTable


def make(n: int = 3):
    released: list[int] = []
    return SlotTable(n, capacity=100, on_release=released.append), released


def test_acquire_lowest_free_slot_first():
    table, _ = make()
    a, b, c = table.acquire(), table.acquire(), table.acquire()
    assert [x.slot for x in (a, b, c)] == [0, 1, 2]
    assert all(x.generation == 0 and x.capacity == 100 for x in (a, b, c))
    assert table.acquire() is None
    assert table.busy == 3
    table.release(b)
    again = table.acquire()
    assert (again.slot, again.generation) == (1, 1)


def test_release_bumps_generation_and_frees_once():
    table, released = make()
    lease = table.acquire()
    assert table.is_current(lease)
    assert table.release(lease) is True
    assert released == [0]
    assert not table.is_current(lease)
    # a stale lease changes nothing: no second cleanup, the new owner keeps the slot
    new = table.acquire()
    assert new.generation == 1
    assert table.release(lease) is False
    assert released == [0]
    assert table.is_current(new) and table.busy == 1


def test_generations_count_per_slot():
    table, released = make(2)
    for _ in range(3):
        table.release(table.acquire())
    lease = table.acquire()
    assert (lease.slot, lease.generation) == (0, 3)
    assert released == [0, 0, 0]
