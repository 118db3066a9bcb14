"""bench/results/README.md is generated from the result files: it is up to date, every file is
named <date>-<commit>-<kind> and listed, and a new file makes the check fail until regenerated."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import results_index  # noqa: E402


def test_the_index_is_up_to_date_and_lists_every_file():
    assert results_index.main(["--check"]) == 0
    text = results_index.INDEX.read_text()
    assert "Not named" not in text
    for path in results_index.RESULTS.iterdir():
        if path != results_index.INDEX and path.is_file():
            assert f"[{path.name}]({path.name})" in text


def test_a_new_result_file_makes_the_check_fail(tmp_path, monkeypatch):
    for path in results_index.RESULTS.iterdir():
        if path.is_file():
            (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(results_index, "RESULTS", tmp_path)
    monkeypatch.setattr(results_index, "INDEX", tmp_path / "README.md")
    assert results_index.main(["--check"]) == 0
    (tmp_path / "2026-12-04-abc1234-mission.json").write_text(
        '{"scenario": "mission", "requests": 8, "prompt_tokens": 255000, "model_kind": "locality"}'
    )
    assert results_index.main(["--check"]) == 1
    assert results_index.main([]) == 0
    assert "8 x 255000 prompt tokens, locality model" in (tmp_path / "README.md").read_text()
    assert results_index.main(["--check"]) == 0
