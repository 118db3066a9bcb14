"""The server's hand-over of engine events to its event loop (server/streams.py LoopMailbox)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from server.streams import LoopMailbox


def test_events_posted_together_wake_the_loop_once_and_keep_their_order():
    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        plain = loop.call_soon_threadsafe

        def counted(*args):
            nonlocal wakes
            wakes += 1
            return plain(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        box = LoopMailbox.of(loop)
        assert LoopMailbox.of(loop) is box
        queues: list[asyncio.Queue] = [asyncio.Queue(), asyncio.Queue()]
        # a step's events, posted from another thread while the loop is busy
        poster = threading.Thread(target=lambda: [box.post(queues[i % 2], i) for i in range(8)])
        poster.start()
        poster.join()
        got = [[await q.get() for _ in range(4)] for q in queues]
        box.post(queues[0], 8)  # a later batch wakes it again
        got[0].append(await queues[0].get())
        return got, wakes

    got, wakes = asyncio.run(main())
    assert got == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]
    assert wakes == 2


def test_every_post_to_a_closed_loop_raises():
    """The engine cancels a request whose sink raises: each post must raise, not only the one
    that would have woken the loop."""
    loop = asyncio.new_event_loop()
    box = LoopMailbox(loop)
    loop.close()
    queue: asyncio.Queue = asyncio.Queue()
    for ev in range(3):
        with pytest.raises(RuntimeError):
            box.post(queue, ev)
