"""bench/agents.py (the prefix cache's agent scenario) against two demo-model servers, one with
the cache and paging, one without: every follow-up finds its previous prompt cached (resumed in
the slot its previous turn left) and answers as the cold server does, one more follow-up sent
alone has the cold server's tokens and logprobs, and the record carries the cache's figures and
a ledger back at its start."""

from __future__ import annotations

import json

import pytest
from conftest import start_server, stop_server

from pyqsa.bench import agents

COMMON = ["--slots", "2", "--ctx", "2048", "--sampling", "host", "--threads", "1"]


@pytest.fixture(scope="module")
def servers(demo_gguf, cache_dir):
    warm = start_server(
        [str(demo_gguf), *COMMON, "--prefix-cache-gib", "0.25", "--kv-offload", "host"], cache_dir
    )
    cold = start_server([str(demo_gguf), *COMMON, "--prefix-cache-gib", "0"], cache_dir)
    yield warm, cold
    stop_server(warm)
    stop_server(cold)


def test_follow_ups_reuse_their_history_and_answer_as_cold(servers, tmp_path):
    warm, cold = servers
    out = tmp_path / "agents.json"
    args = ["--agents", "2", "--history-tokens", "1200", "--shared-tokens", "400", "--turns", "2"]
    args += ["--turn-tokens", "60", "--max-tokens", "8", "--cold-url", cold.url, "--out", str(out)]
    args += ["--check-url", cold.url, "--check-history-tokens", "900"]
    args += ["--results", str(tmp_path / "results")]
    assert agents.main([warm.url, *args]) == 0
    record = json.loads(out.read_text())
    (saved,) = (tmp_path / "results").iterdir()
    assert saved.name.endswith("-prefix.json") and json.loads(saved.read_text()) == record
    assert record["scenario"] == "prefix" and record["agents"] == 2
    turns = record["turn_records"]
    assert sorted((t["agent"], t["turn"]) for t in turns) == [
        (a, k) for a in (0, 1) for k in (0, 1, 2)
    ]
    assert record["same_as_cold"] is True
    for t in turns:
        assert t["completion_tokens"] == 8 and 0 < t["ttft_s"] <= t["ttft_text_s"]
        if t["turn"] > 0:  # all but the new tokens (and at most a block of the history) cached
            assert t["cached_tokens"] >= t["prompt_tokens"] - 60 - 8, t
    assert record["follow_up_cached_share"] > 0.9
    assert set(record["ttft_s_by_turn"]) == {"0", "1", "2"}
    # one more agent, alone on both servers: exactly the cold server's tokens and logprobs
    assert [c["turn"] for c in record["check"]] == [0, 1, 2]
    for c in record["check"]:
        assert c["same_tokens"] and c["same_logprobs"], c
        assert c["cold_cached_tokens"] == 0
        assert c["first_difference"] is None and c["max_logprob_delta_before"] == 0.0
        assert c["margin_there"] is None
        timing = c["to_first_token"]  # the server's passes until the first token
        assert timing["pyqsa_engine_steps_total"] >= 1, timing
        assert timing['pyqsa_engine_step_seconds_total{part="forward"}'] > 0, timing
        assert c["cached_tokens"] == (c["prompt_tokens"] - 60 if c["turn"] else 0)
    # each agent's follow-up resumes its prompt in the slot it left (the figures "after" are
    # taken before the lone agent)
    starts = {k: record["after"][k] - (record["before"][k] or 0) for k in agents.PREFIX_METRICS}
    assert starts['pyqsa_prefix_cache_starts_total{how="resume"}'] == 2 * 2, starts
    assert starts['pyqsa_prefix_cache_starts_total{how="restore"}'] == 0
    assert record["device"]["back_to_baseline"]["ledger"] is True
    assert record["host_bytes_held"] == record["after"]["pyqsa_prefix_cache_bytes"] > 0
    assert record["after"]["pyqsa_prefix_cache_bytes"] > 0
    hits = record["after"]["pyqsa_prefix_cache_hit_tokens_total"]
    assert hits - (record["before"]["pyqsa_prefix_cache_hit_tokens_total"] or 0) > 2 * 2 * 1000


def test_bad_counts_are_usage_errors():
    for args in (["--shared-tokens", "10", "--history-tokens", "5"], ["--agents", "0"]):
        with pytest.raises(SystemExit) as e:
            agents.main(["http://127.0.0.1:1", *args])
        assert e.value.code == 2


def test_combine_refuses_what_is_no_run_of_the_scenario(tmp_path, capsys):
    """`agents.py combine`: a file that is no JSON record, a record without the figures, or runs
    of another commit end in argparse's one-line error, not a traceback."""
    run = {
        "commit": "abc1234",
        "model": "m",
        "agents": 2,
        "history_tokens": 10,
        "turns": 1,
        "turn_tokens": 5,
        "max_tokens": 2,
    }
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "bare.json").write_text(json.dumps(run))
    (tmp_path / "other.json").write_text(json.dumps(run | {"commit": "def5678"}))
    for files, says in (
        (["garbage.json"], "Expecting property name"),
        (["bare.json"], "follow_up_ttft_s"),
        (["bare.json", "other.json"], "runs of another scenario or commit: ['commit']"),
        (["missing.json"], "No such file"),
    ):
        with pytest.raises(SystemExit) as e:
            agents.main(["combine", *(str(tmp_path / f) for f in files)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("agents.py combine: error: ") and says in err, err


def _chunk(token: str, lp: float, top: dict[str, float]) -> dict:
    return {"tokens": [token], "token_logprobs": [lp], "top_logprobs": [top]}


def test_divergence_finds_where_replies_part_and_the_margins_there():
    warm = [_chunk("a", -0.1, {"a": -0.1, "b": -2.5}), _chunk("c", -0.70, {"c": -0.70, "d": -0.71})]
    cold = [_chunk("a", -0.1004, {"a": -0.1004, "b": -2.5}), _chunk("d", -0.70, {"d": -0.70})]
    d = agents.divergence(warm, cold)
    assert d["first_difference"] == 1
    assert abs(d["max_logprob_delta_before"] - 0.0004) < 1e-9
    assert abs(d["margin_there"] - 0.01) < 1e-9 and d["cold_margin_there"] is None
    same = agents.divergence(warm, warm)
    assert same == {
        "first_difference": None,
        "max_logprob_delta_before": 0.0,
        "margin_there": None,
        "cold_margin_there": None,
    }
