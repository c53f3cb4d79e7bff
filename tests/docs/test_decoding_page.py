"""docs/decoding.md: its Python examples run as written (in order, one namespace) on tiny checkpoints, and so
do its commands, so the page cannot drift from the API; what they print is not asserted (the models are
untrained)."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest
import torch

from attnx.model import build_transformer
from tests.checkpoints import save_model, train_tokenizer
from tests.conftest import REPO, tiny_config
from tests.inference.conftest import multi30k_lines

PAGE = REPO / "docs" / "decoding.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


@pytest.mark.slow  # untrained models decode to the page's maximum length (input + 50), with beam 5
def test_every_python_example_of_the_decoding_page_runs(shared_data: Path, tmp_path: Path, monkeypatch):
    lines = multi30k_lines(shared_data, "train.en.gz", 200) + multi30k_lines(shared_data, "train.de.gz", 200)
    tokenizer = train_tokenizer(lines, 150)
    config = tiny_config(vocab_size=tokenizer.vocab_size, max_len=64)
    for seed, name in enumerate(["model.ckpt", "run1/averaged.ckpt", "run2/averaged.ckpt"]):
        torch.manual_seed(seed)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        save_model(tmp_path / name, build_transformer(config), config, tokenizer)
    blocks = python_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 6, "the page lost its examples"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own examples
    assert os.getcwd() == str(tmp_path)
    hyps = namespace["translator"].generate(["A dog runs through the grass."])[0]
    assert len(hyps) == 3  # the page's beam 5, 3-best
    assert [j for _, j in namespace["hyp"].alignment] == list(range(len(namespace["hyp"].tokens)))


def test_every_command_of_the_decoding_page_runs(clone: Path, shared_data: Path, capfd, monkeypatch) -> None:
    """The page's ```bash commands, run as written (tests/docs/recipes.py) in a folder as the README's set-up
    leaves a clone: the checkpoints it names (`averaged.ckpt`, `model.ckpt`, `base.ckpt`) are the README run's
    tiny `averaged.ckpt`, its text files a few test sentences, its constraints files one line per line of
    theirs. `attnx translate` and `attnx test` get short outputs appended (an untrained model writes to the
    length limit). Not run: the request to `attnx serve` (tests/serving/ run the server)."""
    from tests.docs.recipes import Recipe, bash_blocks

    averaged = clone / "runs" / "multi30k_cpu" / "version_0" / "checkpoints" / "averaged.ckpt"
    for name in ("averaged.ckpt", "model.ckpt", "base.ckpt"):
        os.link(averaged, clone / name)
    test_en = multi30k_lines(shared_data, "test_2016_flickr.en.gz", 3)
    newstest = gzip.decompress((shared_data / "wmt14_ende_test" / "newstest2014.en.gz").read_bytes())
    for name, lines in (
        ("test.en", test_en),
        ("doc.en", test_en[:2]),
        ("doc.terms.jsonl", ['["Hund"]', "null"]),
        ("test.terms.jsonl", ['{"include": ["Hund"]}'] + ["null"] * 49),  # the clone's test set: 50 sentences
        ("newstest2014.en", newstest.decode().splitlines()[:3]),
    ):
        (clone / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    short = [
        "--trainer.limit_test_batches",
        "1",
        "--data.eval_max_tokens",
        "300",
        "--evaluation.search.max_len_b",
        "5",
    ]
    # a length limit the page's phrase to include fits (9 pieces of the clone's 300-piece vocabulary)
    options = {"translate": ["--search.max_len_a", "0", "--search.max_len_b", "12"], "test": short}
    recipe = Recipe(clone, capfd, monkeypatch, options)
    ran = recipe.run_all(bash_blocks(PAGE.read_text(encoding="utf-8")), skip={"curl ": "needs a server"})
    assert recipe.applied == {"translate", "test"} and len(ran) == 8, [r.line for r in ran]
    assert len((clone / "test.mbr.de").read_text(encoding="utf-8").splitlines()) == 3  # `> test.mbr.de`
    epsilon = [json.loads(line) for line in ran[1].out.splitlines()]
    assert len(epsilon) == 3 and all("expected_utility" in h for line in epsilon for h in line["hypotheses"])
    assert "sacreBLEU BLEU = " in ran[2].said and "sacreBLEU BLEU = " in ran[5].said
    assert [len(r.out.splitlines()) for r in ran[3:5]] == [2, 2]  # one translation per line of doc.en
    for output in ("out.de", "out.fp32.de"):
        assert len((clone / output).read_text(encoding="utf-8").splitlines()) == 3
