"""docs/translate.md's commands, run as written (tests/docs/recipes.py) in a folder as the README's set-up
command leaves a clone (tests/docs/conftest.py), and its Python example after them.

The checkpoints the page names (`averaged.ckpt`, `m.ckpt`, `a.ckpt`, `run1/averaged.ckpt`, ...) are the
README run's `averaged.ckpt` (a tiny model), its text files (`test.en`, `in.en`, `test.de`) three Multi30k test
sentences. `attnx translate` gets `--search.max_len_a 0 --search.max_len_b 6` appended: an untrained model
writes to the length limit, and the page's limit (input + 50 pieces) with beam 8 would take a minute. What is
asserted is what the page says of each output's form, never what the model translates.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs.recipes import Recipe, bash_blocks
from tests.docs.test_decoding_page import python_blocks

PAGE = REPO / "docs" / "translate.md"

OPTIONS = {"translate": ["--search.max_len_a", "0", "--search.max_len_b", "6"]}

CHECKPOINTS = ["averaged.ckpt", "m.ckpt", "a.ckpt", "b.ckpt", "run1/averaged.ckpt", "run2/averaged.ckpt"]


def stand_ins(clone: Path) -> None:
    """The page's checkpoints and text files, in `clone`."""
    averaged = clone / "runs" / "multi30k_cpu" / "version_0" / "checkpoints" / "averaged.ckpt"
    for name in CHECKPOINTS:
        (clone / name).parent.mkdir(exist_ok=True)
        os.link(averaged, clone / name)
    for name, lang in (("test.en", "en"), ("in.en", "en"), ("test.de", "de")):
        text = gzip.decompress((clone / "raw" / "multi30k" / f"test_2016_flickr.{lang}.gz").read_bytes())
        (clone / name).write_text("\n".join(text.decode().splitlines()[:3]) + "\n", encoding="utf-8")


def test_every_command_and_example_of_the_page_runs(
    clone: Path, capfd, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_ins(clone)
    ran = Recipe(clone, capfd, monkeypatch, OPTIONS).run_all(bash_blocks(PAGE.read_text(encoding="utf-8")))
    by_line = {r.line.split("#")[0].strip(): r for r in ran}

    def out(command: str) -> list[str]:
        return by_line[command].out.splitlines()

    assert len(ran) == 13, [r.line for r in ran]
    assert len(out('echo "A dog runs." | attnx translate --model averaged.ckpt')) == 1
    assert len((clone / "test.hyp").read_text(encoding="utf-8").splitlines()) == 3
    assert len((clone / "flickr.hyp").read_text(encoding="utf-8").splitlines()) == 50  # the whole test set
    nbest = [
        json.loads(line)
        for line in out(
            "attnx translate --model averaged.ckpt --input test.en --search.beam 8 --search.nbest 4 --format jsonl"
        )
    ]
    assert [len(line["hypotheses"]) for line in nbest] == [4, 4, 4]
    assert (
        "BLEU"
        in by_line[
            "attnx score --hypotheses flickr.hyp --references raw/multi30k/test_2016_flickr.de.gz"
        ].said
    )
    token_scores = json.loads(
        out(
            'echo "A dog runs." | attnx translate --model averaged.ckpt --search.nbest 2 --format jsonl '
            "--token_scores true"
        )[0]
    )["hypotheses"][0]
    assert len(token_scores["pieces"]) == len(token_scores["token_log_probs"])
    moses = out(
        "attnx translate --model m.ckpt --input in.en --search.beam 8 --search.nbest 8 --format moses"
    )
    assert len(moses) == 24 and all(" ||| F0= " in line for line in moses)
    forced = out("attnx translate --model m.ckpt --input test.en --target test.de")
    assert len(forced) == 3 and all(float(value) < 0 for value in forced)  # log P per line
    for ensemble in (
        "attnx translate --model run1/averaged.ckpt run2/averaged.ckpt --input test.en",
        "attnx translate --model a.ckpt:b.ckpt --input test.en",
        'attnx translate --model "[a.ckpt,b.ckpt]" --weights 0.6 0.4 --input test.en',
    ):
        assert len(out(ensemble)) == 3, ensemble
    [python] = python_blocks(PAGE.read_text(encoding="utf-8"))
    monkeypatch.chdir(clone)
    exec(compile(python, str(PAGE), "exec"), {"__name__": "__main__"})  # noqa: S102 - the page's own example
