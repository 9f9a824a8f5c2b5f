"""bench/repetition.py: the repeated n-gram share it reports for a target's generated rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module

repetition = load_module(ROOT / "bench" / "repetition.py")


def rows(path: Path, *completions: tuple[list[int], str]) -> Path:
    path.write_text(
        "".join(json.dumps({"completion_token_ids": ids, "finish_reason": r}) + "\n" for ids, r in completions)
    )
    return path


def test_counts_ngrams_seen_earlier_in_the_same_answer_only(tmp_path: Path) -> None:
    # Row 1: 1 2 1 2 1 has bigrams (1,2) (2,1) (1,2) (2,1): two repeats of four. Row 2 repeats
    # row 1's bigrams, which does not count: repeats are within one answer.
    path = rows(tmp_path / "rows-0.jsonl", ([1, 2, 1, 2, 1], "length"), ([1, 2, 3], "stop"))
    result = repetition.repetition(path, n=2)
    assert result == {
        "rows": 2,
        "repeated_2gram_share": round(2 / 6, 3),
        "truncated_share": 0.5,
        "mean_completion_tokens": 4.0,
    }
    assert repetition.repetition(path, n=2, rows=1)["repeated_2gram_share"] == 0.5


def test_cli_names_a_missing_rows_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        repetition.main([str(tmp_path / "nope.jsonl")])
    assert "no rows file" in capsys.readouterr().err
