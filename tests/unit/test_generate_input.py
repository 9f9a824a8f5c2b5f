"""jobs.generate's input handling, without a server."""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

import pytest

from jobs import generate


def test_perfectblend_conversation_sends_turns_before_the_first_answer() -> None:
    q = generate.to_question(
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi?"},
                {"from": "gpt", "value": "Hello."},
                {"from": "human", "value": "More?"},
            ]
        }
    )
    assert q.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    assert q.id == generate.content_id(q.messages)  # stable content hash when no id is given


def test_given_id_and_plain_prompt() -> None:
    assert generate.to_question({"id": 7, "prompt": "x"}) == generate.Question("7", [{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "record", [{"prompt": ""}, {"text": "x"}, [1, 2], {"messages": [{"role": "assistant", "content": "a"}]}]
)
def test_rows_without_a_question_are_refused(record: object) -> None:
    with pytest.raises(ValueError):
        generate.to_question(record)


def test_sharding_is_a_partition() -> None:
    ids = [f"id-{i}" for i in range(1000)]
    shards = [{i for i in ids if generate.shard_of(i, 3) == r} for r in range(3)]
    assert sum(len(s) for s in shards) == 1000
    assert set().union(*shards) == set(ids)
    assert all(len(s) > 250 for s in shards)


def test_partial_last_line_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "rows-0.jsonl"
    path.write_text(json.dumps({"id": "a"}) + "\n" + '{"id": "b", "content": "trunc')
    assert generate.finished_ids(tmp_path) == {"a"}
    assert path.read_text() == json.dumps({"id": "a"}) + "\n"


def test_reasoning_split_without_a_parser() -> None:
    assert generate.split_reasoning({"content": "<think>\nhmm\n</think>\n\nfour"}) == ("hmm", "four")
    assert generate.split_reasoning({"content": "four", "reasoning": "hmm"}) == ("hmm", "four")


def bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Each unreadable kind of dataset, and what its one line must say."""
    parquet = tmp / "corrupt.parquet"
    parquet.write_bytes(b"PAR1" + b"\x00garbage" * 10)
    jsonl = tmp / "latin1.jsonl"
    jsonl.write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    bad_json = tmp / "bad.json"
    bad_json.write_text('[{"prompt": "a"},')
    not_datasets = tmp / "plain-dir"
    not_datasets.mkdir()
    (not_datasets / "notes.txt").write_text("not a dataset")
    return {
        "parquet": (parquet, "cannot be read as a Parquet file"),
        "jsonl": (jsonl, "not UTF-8 text (line 1, byte 0xe9 at column 16)"),
        "json": (bad_json, "not valid JSON"),
        "dir": (not_datasets, "cannot be read as a datasets directory"),
    }


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "json", "dir"])
def test_an_unreadable_dataset_gets_one_line_naming_the_file(kind: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path, says = bad_inputs(tmp_path)[kind]
    assert generate.main(["--check-input", "--input", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"jobs.generate: {path}: ") and says in err, err


def test_check_input_counts_rows_and_questions(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "q.jsonl"
    path.write_text('{"prompt": "a"}\n{"nothing": 1}\nnot json\n{"prompt": "b"}\n')
    assert generate.main(["--check-input", "--input", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": 4, "questions": 2, "malformed": 2}


def test_an_empty_prompt_is_called_empty() -> None:
    with pytest.raises(ValueError, match="'prompt' is empty"):
        generate.to_question({"prompt": "  \n"})


@pytest.mark.parametrize(
    ("content", "says"),
    [("", "(the file has no rows)"), ('{"prompt": ""}\nnot json\n', "(2 malformed rows skipped)")],
)
def test_a_shard_without_questions_fails_the_job(content: str, says: str, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    argv = ["--input", str(path), "--out", str(tmp_path / "out"), "--model", "m", "--server", "http://127.0.0.1:9"]
    assert generate.main(argv) == 2
    assert f"{path}: no question for rank 0 of 1 {says}" in caplog.text
    assert not (tmp_path / "out" / "summary-0.json").exists()


def test_an_empty_shard_of_a_dataset_fails_that_rank_only(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n')
    owner = generate.shard_of("a", 2)
    settings = generate.Settings("http://127.0.0.1:9", "m", 1, {}, 1.0, 1.0, 1, False)
    with pytest.raises(generate.NothingToGenerate, match=f"rank {1 - owner} of 2"):
        generate.generate(path, tmp_path / "out", settings, rank=1 - owner, world_size=2)


def test_progress_shows_the_recent_rate_and_an_outage_from_its_first_second() -> None:
    settings = generate.Settings("http://127.0.0.1:9", "m", 1, {}, 300.0, 1.0, 1, False)
    gen = generate.Generator(settings, None, None, generate.Stats(total=100, done=10))  # type: ignore[arg-type]
    now = time.monotonic()
    gen.stats.completion_tokens = 1100
    # 1000 tokens in the first 100 s, 100 in the last 100: the line shows the last minute's rate.
    recent = deque([(now - 200, 0), (now - 100, 1000)])
    assert gen.progress_line(recent, window=60) == "generate: 10/100 rows, 0 failed, 1 tok/s"
    gen.unreachable_since = time.monotonic() - 12
    assert gen.progress_line(recent, window=60) == (
        "generate: 10/100 rows, 0 failed, server unreachable for 12 s (limit 300 s)"
    )
