"""The trained tiny target: its corpus, question pools and committed artifact (models/tiny-python)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import tiny_corpus, tiny_model, tiny_pretrain

SOURCE = '''
def documented(a, b=2):
    """Add two numbers. More text here."""
    return a + b


def undocumented(x):
    return x


class Thing:
    def method(self):
        """Do the thing.

        Details.
        """
        return 1
'''


@pytest.fixture
def stdlib(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text(SOURCE)
    (root / "mod.py").write_text(SOURCE)
    (root / "test").mkdir()
    (root / "test" / "skipped.py").write_text(SOURCE)
    (root / "broken.py").write_text("def (:\n")
    return root


def test_samples_are_documented_functions_and_methods_with_their_source(stdlib: Path) -> None:
    samples = tiny_corpus.stdlib_samples(stdlib)
    assert [s.id for s in samples] == ["mod:Thing.method", "mod:documented", "pkg:Thing.method", "pkg:documented"]
    documented = samples[1]
    assert documented.question == "Write `documented` from `mod`."
    assert documented.reasoning == "`documented` is in `mod`: `documented(a, b=2)`. Add two numbers."
    assert documented.answer.startswith("def documented(a, b=2):") and documented.answer.endswith("return a + b")
    assert samples[0].answer.startswith("def method(self):")  # dedented out of its class
    assert samples[0].messages()[1] == {
        "role": "assistant", "reasoning_content": samples[0].reasoning, "content": samples[0].answer,
    }  # fmt: skip


def test_pools_are_disjoint_fixed_by_id_and_written_as_pipeline_rows(tmp_path: Path) -> None:
    samples = [tiny_corpus.Sample(f"m:f{i}", "m", f"f{i}", f"Write `f{i}` from `m`.", "r", "a") for i in range(3000)]
    counts = tiny_corpus.write(tmp_path, samples)
    generation = [json.loads(line) for line in (tmp_path / "generation.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert counts == {"samples": 3000, "generation": len(generation), "heldout": len(heldout)}
    assert 0.06 * 3000 < len(generation) < 0.14 * 3000 and 0 < len(heldout) < 0.05 * 3000
    assert not {r["id"] for r in generation} & {r["id"] for r in heldout}
    assert all(set(r) == {"id", "prompt"} and r["prompt"] == f"Write `{r['id'][2:]}` from `m`." for r in heldout)
    assert all(tiny_corpus.pool(r["id"]) == "heldout" for r in heldout)
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 3000


def test_committed_artifact_matches_its_recipe_and_the_pool_split() -> None:
    manifest = json.loads((tiny_model.TRAINED / "recipe.json").read_text())
    assert manifest["recipe_sha256"] == tiny_pretrain.recipe_hash(manifest["recipe"])
    assert set(manifest["files"]) == set(tiny_pretrain.ARTIFACT_FILES)
    assert manifest["recipe"]["config"] == tiny_pretrain.llama_config()
    assert json.loads((tiny_model.TRAINED / "config.json").read_text()) == tiny_pretrain.llama_config()
    for name, digest in manifest["files"].items():
        assert tiny_pretrain.sha256(tiny_model.TRAINED / name) == digest, name
    for pool in ("generation", "heldout"):
        ids = [json.loads(line)["id"] for line in (tiny_model.TRAINED / f"{pool}.jsonl").read_text().splitlines()]
        assert ids and all(tiny_corpus.pool(i) == pool for i in ids), pool


def test_install_checks_hashes_and_is_cached(tmp_path: Path) -> None:
    out = tiny_model.install_trained(tmp_path / "tiny")
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    marker = (out / ".tiny-model.json").stat().st_mtime_ns
    tiny_model.install_trained(out)
    assert (out / ".tiny-model.json").stat().st_mtime_ns == marker

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model.TRAINED, broken)
    (broken / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"tokenizer\.json: sha256 .* is not the recipe's"):
        tiny_model.install_trained(tmp_path / "other", artifact=broken)
    assert not (tmp_path / "other").exists()


def test_trained_prompts_come_from_the_disjoint_pools(tmp_path: Path) -> None:
    train, heldout = tiny_model.write_trained_prompts(tmp_path, train=50, heldout=10)
    train_ids = [json.loads(line)["id"] for line in train.read_text().splitlines()]
    heldout_ids = [json.loads(line)["id"] for line in heldout.read_text().splitlines()]
    assert len(train_ids) == 50 and len(heldout_ids) == 10
    assert not set(train_ids) & set(heldout_ids)
    with pytest.raises(SystemExit, match="questions, 100000 were asked for"):
        tiny_model.write_trained_prompts(tmp_path, train=100000)


def test_all_trained_prompts_is_the_whole_generation_pool(tmp_path: Path) -> None:
    questions = tmp_path / "q"
    assert tiny_model.main(["--out", str(tmp_path / "m"), "--prompts", str(questions), "--train-prompts", "all"]) == 0
    pool = (tiny_model.TRAINED / "generation.jsonl").read_text().splitlines()
    assert (questions / "train.jsonl").read_text().splitlines() == pool
    random = ["--kind", "random", "--out", str(tmp_path / "r"), "--prompts", str(tmp_path / "rq")]
    with pytest.raises(SystemExit):  # the random target has no pool to take all of
        tiny_model.main([*random, "--train-prompts", "all"])
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("module", [tiny_corpus, tiny_pretrain, tiny_model])
def test_cli_help(module, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_reasoning_markers_survive_decoding_so_vllms_parser_can_split() -> None:
    # vLLM decodes with skip_special_tokens and its reasoning parser looks for "</think>" in that
    # text: a special </think> would leave the whole answer in the reasoning. In a fresh
    # interpreter, as vLLM loads it: transformers imports torch._dynamo, which cannot register its
    # sys.intern polyfill once another test has imported ansible's module_utils (they patch it).
    check = """
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok("why\\n</think>\\ndef f(): pass<|im_end|>", add_special_tokens=False)["input_ids"]
assert tok.convert_tokens_to_ids("</think>") in ids, ids
text = tok.decode(ids, skip_special_tokens=True)
assert text == "why\\n</think>\\ndef f(): pass", repr(text)
"""
    done = subprocess.run([sys.executable, "-c", check, str(tiny_model.TRAINED)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
