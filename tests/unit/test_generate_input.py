"""jobs.generate's input handling, without a server."""

from __future__ import annotations

import json
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
