"""The prefix cache on its own: longest match, LRU eviction order, held entries, collisions."""

import numpy as np
import pytest

from pyqsa.engine import prefix_cache
from pyqsa.engine.prefix_cache import PrefixCache, Tokens
from pyqsa.engine.prefix_rows import RowSegment

TOKENS = list(range(100, 200))


def state(n_bytes: int) -> bytes:
    return bytes(n_bytes)


def entry_bytes(n_tokens: int, n_state: int) -> int:
    return n_state + 8 * n_tokens  # tokens are kept as int64


def test_longest_cached_prefix_shorter_than_the_prompt():
    c = PrefixCache(1 << 20)
    for n in (10, 40, 70):
        assert c.insert(TOKENS[:n], state(n))
    assert c.match(TOKENS[:70] + [1, 2]).n_tokens == 70
    # at least two tokens are left to compute: else the next shorter entry
    assert c.match(TOKENS[:70] + [1]).n_tokens == 40
    assert c.match(TOKENS[:70]).n_tokens == 40
    assert c.match(TOKENS[:42]).n_tokens == 40
    assert c.match(TOKENS[:41]).n_tokens == 10
    assert c.match(TOKENS[:11]) is None
    assert c.match(TOKENS[:5] + [7] * 80) is None  # diverges inside the first entry
    assert c.match(TOKENS[:50] + [7] * 30).n_tokens == 40  # diverges after the second


def test_bytes_and_refs_return_to_zero():
    c = PrefixCache(1 << 20)
    c.insert(TOKENS[:10], state(1000))
    c.insert(TOKENS[:20], state(2000))
    assert c.bytes == entry_bytes(10, 1000) + entry_bytes(20, 2000)
    held = c.match(TOKENS[:30])
    assert (held.n_tokens, held.refs) == (20, 1)
    c.clear()  # the held one stays
    assert (len(c), c.bytes) == (1, entry_bytes(20, 2000))
    c.release(held)
    c.clear()
    assert (len(c), c.bytes) == (0, 0)
    assert c.match(TOKENS) is None


def test_eviction_is_lru_whole_entries_never_held_ones():
    one = entry_bytes(10, 1000)
    c = PrefixCache(3 * one)
    a, b, d = ([i] * 10 for i in (1, 2, 3))
    for t in (a, b, d):
        assert c.insert(t, state(1000))
    assert c.match(a + [0, 0]).refs == 1  # a is used now (and held); b is the least recent
    assert c.insert([4] * 10, state(1000))
    assert (c.evicted, c.contains(b), c.contains(a), c.contains(d)) == (1, False, True, True)
    held_d = c.match(d + [0, 0])
    assert c.insert([5] * 10, state(1000))  # a and d are held: [4]*10 goes
    assert (c.evicted, c.contains([4] * 10)) == (2, False)
    assert not c.insert([6] * 10, state(1000) + bytes(2 * one))  # cannot fit beside held ones
    assert c.contains([5] * 10) and c.bytes == 3 * one  # nothing evicted for it
    c.release(held_d)
    assert c.insert([6] * 10, state(1000))
    assert (c.evicted, c.contains(d)) == (3, False)


def test_an_entry_larger_than_the_budget_is_not_kept():
    c = PrefixCache(100)
    assert not c.insert(TOKENS[:4], state(200))
    assert (len(c), c.bytes, c.evicted) == (0, 0, 0)


def test_same_tokens_kept_once():
    c = PrefixCache(1 << 20)
    assert c.insert(TOKENS[:10], state(10))
    assert not c.insert(TOKENS[:10], state(10))
    assert len(c) == 1


def test_a_hash_collision_is_a_miss_not_a_wrong_state(monkeypatch):
    c = PrefixCache(1 << 20)
    monkeypatch.setattr(  # every prefix of a length collides
        prefix_cache, "prefix_hashes", lambda t: np.zeros(len(t), np.uint64)
    )
    c.insert([1, 2, 3], state(3))
    assert c.match([1, 2, 4, 5, 6]) is None
    assert c.match([1, 2, 3, 5, 6]).n_tokens == 3


def test_negative_budget_refused():
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)


def test_budget():
    from pyqsa.engine.prefix_cache import DEFAULT_BUDGET_UNKNOWN_HOST, budget

    GiB = 2**30
    assert budget(None, 10 * GiB, 0) == 2 * GiB  # a fifth of MemAvailable
    assert budget(None, 10 * GiB, 5 * GiB) == GiB  # beside the paging host store
    assert budget(None, GiB, 2 * GiB) == 0
    assert budget(None, None, 0) == DEFAULT_BUDGET_UNKNOWN_HOST
    assert budget(0, 10 * GiB, 0) == 0
    assert budget(1.5, None, 0) == 3 * GiB // 2
    assert budget(5, 10 * GiB, 5 * GiB) == 5 * GiB
    with pytest.raises(ValueError, match="beside the paging host store"):
        budget(5.1, 10 * GiB, 5 * GiB)
    with pytest.raises(ValueError, match="available \\(MemAvailable\\)"):
        budget(11, 10 * GiB, 0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not a size in GiB"):
            budget(bad, None, 0)


def test_prefix_hashes_match_one_by_one():
    t = Tokens(TOKENS)
    for n in (1, 7, len(TOKENS)):
        assert t.hash(n) == Tokens(TOKENS[:n]).hash(n)
    assert Tokens([1, 2]).hash(2) != Tokens([2, 1]).hash(2)


@pytest.mark.parametrize("n,m", [(0, 5), (1, 1), (7, 0), (1000, 37), (3, 5000)])
def test_extended_tokens_are_the_tokens_of_the_whole(n, m):
    rng = np.random.default_rng(n + m)
    a, b = rng.integers(0, 150_000, n).tolist(), rng.integers(0, 150_000, m).tolist()
    prefix_cache._powers = np.ones(1, np.uint64)  # the powers grow for the extension too
    got, want = Tokens(a).extended(b), Tokens(a + b)
    assert np.array_equal(got.array, want.array)
    assert np.array_equal(got.hashes(), want.hashes())


def test_entries_share_segments_counted_once():
    """The snapshots of one sequence share its rows: a segment's bytes count once and go with the
    last entry holding it; an entry fits when its new segments do."""
    head = state(10)
    a, b = RowSegment(0, 10, 1000, slot=0), RowSegment(10, 20, 1000, slot=0)
    own = entry_bytes(10, 10), entry_bytes(20, 10), entry_bytes(21, 10)
    c = PrefixCache(own[1] + own[2] + 2000 + 400)  # all but the 10-token entry's own bytes
    t = Tokens(TOKENS[:20])
    assert c.insert(t, head, [a], n=10) and c.insert(t, head, [a, b])
    assert c.bytes == own[0] + own[1] + 2000 and (a.refs, b.refs) == (2, 1)
    held = c.match(TOKENS[:22])
    assert held.n_tokens == 20
    # a third entry sharing a and b: with 500 new bytes no room beside the held one; with 400 and
    # nothing held, room once the 10-token entry goes (its own bytes: a stays, in the others)
    assert not c.insert(TOKENS[:21], head, [a, b, RowSegment(20, 21, 500, slot=0)])
    c.release(held)
    assert c.insert(TOKENS[:21], head, [a, b, RowSegment(20, 21, 400, slot=0)])
    assert c.evicted == 1 and not a.dropped and c.contains(TOKENS[:21])
    c.clear()
    assert (c.bytes, len(c)) == (0, 0) and a.dropped and b.dropped
