"""bench/serve_load.py's window arithmetic: the decode rate while every request decodes."""

from __future__ import annotations

import random

import pytest

from pyqsa.bench import serve_load


def run(times: list[float], tokens: int | None = None) -> dict:
    return {"t0": 0.0, "times": times, "completion_tokens": tokens or len(times)}


def test_the_window_runs_from_the_last_first_token_to_the_first_last_one():
    a = run([1.0, 2.0, 3.0, 4.0, 5.0])
    b = run([2.5, 3.0, 3.5, 4.0, 4.5, 9.0])
    # window (2.5, 5.0]: a's 3.0, 4.0, 5.0 and b's 3.0, 3.5, 4.0, 4.5
    assert serve_load.together_rate([a, b]) == pytest.approx(7 / 2.5)


def test_held_back_tokens_count_in_the_ratio_of_tokens_to_chunks():
    a = run([1.0, 2.0, 3.0, 4.0], tokens=8)  # each chunk carried two tokens on average
    b = run([0.0, 5.0])
    assert serve_load.together_rate([a, b]) == pytest.approx(2 * 3 / 3.0)


def test_no_rate_when_the_requests_never_decode_together():
    assert serve_load.together_rate([run([1.0, 2.0]), run([3.0, 4.0])]) is None
    assert serve_load.together_rate([run([1.0, 2.0]), run([])]) is None
    assert serve_load.together_rate([]) is None


def test_the_longest_gap_in_the_window_is_found_with_where_it_began():
    a = run([1.0, 2.0, 2.01, 2.02, 2.2, 2.21, 3.0])
    b = run([2.0, 2.01, 2.02, 2.2, 2.21, 2.22, 4.0])
    # window (2.0, 3.0]: arrivals 2.01, 2.02, 2.2, 2.21, 2.22, 3.0; the longest wait 2.22 -> 3.0
    assert serve_load.together_longest_gap([a, b]) == {"ms": 780.0, "at_s": 0.22}
    assert serve_load.together_longest_gap([run([1.0]), run([2.0])]) is None


def test_the_engine_step_split_is_taken_inside_the_window():
    def snap(t, steps, forward, host, launch):
        return (t, {"steps": steps, "forward": forward, "host": host, "launch": launch})

    snapshots = [
        snap(0.5, 0, 0.0, 0.0, 0.0),  # before the window: prefill
        snap(1.5, 100, 1.0, 0.1, 0.01),
        snap(2.5, 150, 1.8, 0.2, 0.03),
        snap(3.5, 200, 2.6, 0.3, 0.06),
        snap(4.5, 210, 2.7, 0.32, 0.07),  # after it
    ]
    got = serve_load.engine_in_window(snapshots, (1.0, 4.0))
    # between t = 1.5 and 3.5: 100 steps, 1.6 s forward (0.05 s of it launch), 0.2 s host
    assert got == {
        "steps": 100,
        "forward_ms_per_step": 16.0,
        "host_ms_per_step": 2.0,
        "launch_ms_per_step": pytest.approx(0.5),
        "host_share": pytest.approx(0.111, abs=1e-3),
    }
    assert serve_load.engine_in_window(snapshots, (1.0, 2.0)) is None  # one snapshot inside
    assert serve_load.engine_in_window(snapshots, None) is None


def test_the_prefix_caches_share_of_host_time_where_the_server_has_the_cache():
    before = {"steps": 10, "forward": 1.0, "host": 0.1, "launch": 0.0, "prefix": 0.5}
    before |= {"snapshots": 4, "staged": 4, "copy": 2.0}
    after = {"steps": 110, "forward": 2.5, "host": 0.4, "launch": 0.1, "prefix": 0.7}
    after |= {"snapshots": 7, "staged": 6, "copy": 2.5}
    got = serve_load.engine_between(before, after)
    assert got["host_ms_per_step"] == 3.0 and got["prefix_ms_per_step"] == 2.0
    assert (got["snapshots"], got["staged"], got["copy_ms_per_step"]) == (3, 2, 5.0)
    # a server without the cache has no such counters, and the split says nothing of them
    cache = ("prefix", "snapshots", "staged", "copy")
    without = {k: v for k, v in before.items() if k not in cache}
    got = serve_load.engine_between(without, after)
    assert not {"prefix_ms_per_step", "snapshots", "staged", "copy_ms_per_step"} & got.keys()


def test_the_window_counts_graph_reuses_and_cuda_graph_computes_where_the_server_has_them():
    before = {"steps": 10, "forward": 1.0, "host": 0.1, "launch": 0.0, "reused": 5}
    after = {"steps": 20, "forward": 2.0, "host": 0.2, "launch": 0.1, "reused": 14}
    cuda = {"direct": 3, "captured": 2, "replayed": 5}
    got = serve_load.engine_between(
        before | cuda, after | {"direct": 3, "captured": 3, "replayed": 14}
    )
    want = {"reused": 0.9, "direct": 0.0, "captured": 0.1, "replayed": 0.9}
    assert got["graphs_per_step"] == want
    got = serve_load.engine_between(before, after)  # a CPU server: no CUDA graph counts
    assert got["graphs_per_step"] == {"reused": 0.9}
    samples = {
        "pyqsa_graph_reuses_total": 7.0,
        'pyqsa_cuda_graph_computes_total{how="replayed"}': 3.0,
    }
    assert serve_load.engine_of(samples) == {"reused": 7.0, "replayed": 3.0}


def test_loads_of_other_seeds_draw_other_prompts():
    load = serve_load.Load("http://x", requests=3, prompt_tokens=50, short_prompt_tokens=8)
    runs = [serve_load.draw_prompts(load, random.Random(0)) for _ in range(2)]
    assert runs[0] == runs[1]  # a seed gives the same prompts again
    first, second = (serve_load.draw_prompts(load, random.Random(s)) for s in (1, 2))
    prompts = [tuple(p) for p in (*first[0], *second[0])]
    assert len(set(prompts)) == len(prompts) == 6
    # no prompt is a prefix of another's, so no load starts from another's cache entries
    assert len({p[:16] for p in prompts}) == 6
    assert all(len(p) == 50 for p in prompts) and len(first[1]) == 8


def test_idle_ttft_requests_each_have_a_prompt_of_their_own():
    from pyqsa.bench import serve_ttft

    bodies = serve_ttft.request_bodies("m", 32)
    text = [bodies["text"][1](i)["prompt"] for i in range(40)]
    assert all(len(p) == 32 for p in text) and len({p[0] for p in text}) == 40
    chat = [bodies["chat"][1](i)["messages"][0]["content"] for i in range(40)]
    assert len({c.split()[0] for c in chat}) == 40


def test_a_seed_that_is_no_integer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        serve_load.main(["http://127.0.0.1:1", "--seed", "x"])
    assert e.value.code == 2
    assert "--seed: invalid int value: 'x'" in capsys.readouterr().err
