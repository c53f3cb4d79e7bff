"""docs/training.md's recipes, run as written (tests/docs/recipes.py), each section's commands in order in a
folder as the README's set-up command leaves a clone (tests/docs/conftest.py: Multi30k downloaded and prepared,
the 30-minute run made, all at toy size).

The test appends options to three commands so that each takes seconds: `attnx fit` gets `--config
tiny_fit.yaml` (recipes.tiny_fit: a tiny model on one CPU, 6 steps, whatever config it goes over), `attnx
prepare` a 300-piece vocabulary (the toy corpora have too few words for the page's sizes) and one worker,
`attnx test` one batch of short greedy translations. What a recipe reads that neither the README's set-up nor
the page makes, the test writes first, small: the WMT14 corpora of the weighted-corpora recipe (slices of
other newstests), big.yaml's `data/wmt14_ende` (the prepared Multi30k slice) and eflomal's `train.align` (links
made up within each pair). Not run: eflomal's installation (a package from the network) and the bench/ studies
(hours each). What is asserted is what the page says the commands do, never what a 6-step model translates.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.docs.recipes import Recipe, bash_blocks, commands, sections

PAGE = REPO / "docs" / "training.md"

OPTIONS = {
    "fit": ["--config", "tiny_fit.yaml"],
    "prepare": ["--vocab_size", "300", "--workers", "1"],
    "test": [
        "--trainer.limit_test_batches",
        "1",
        "--data.eval_max_tokens",
        "400",
        "--evaluation.search.beam",
        "1",
        "--evaluation.search.max_len_b",
        "5",
    ],
}

EMA = "An exponential moving average of the weights (`ema`)"
SUBWORDS = "Subword sampling (`data.subword_sampling`)"
WEIGHTS = "Weighted corpora (`data.corpus_weights`, `data.sampling_temperature`)"
CHECKPOINTING = "Activation checkpointing (`model.transformer.activation_checkpointing`)"
LORA = "LoRA adapters (`lora`)"
ALIGNMENT = "Guided alignment (`model.loss: guided_alignment`)"
MEASURING = "Measuring the options on your machine"

NOT_RUN = {
    "eflomal": "installs eflomal from the network; the test writes the train.align it would make",
    "zcat -f raw/multi30k": "eflomal's input, in the block that installs it",
    "n=$(zcat -f raw/multi30k/train.en.gz | wc -l)": "eflomal's output split, in the block that installs it",
    'head -n "$n" align.fwd': "eflomal's output split, in the block that installs it",
    "python bench/": "a study of the options: hours of training",
}
"""The page's commands that no test runs (a part of the line → why)."""


def recipe(clone: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Recipe:
    return Recipe(clone, capfd, monkeypatch, OPTIONS)


def blocks(title: str) -> list[str]:
    return bash_blocks(sections(PAGE)[title])


def test_every_command_of_the_page_is_run_or_said_why_not() -> None:
    tested = {EMA, SUBWORDS, WEIGHTS, CHECKPOINTING, LORA, ALIGNMENT}
    with_commands = {title for title, text in sections(PAGE).items() if bash_blocks(text)}
    assert with_commands == tested | {MEASURING}, "a section with commands and no test of them"
    for line in (line for block in blocks(MEASURING) for line in commands(block)):
        assert any(key in line for key in NOT_RUN), line


def test_the_ema_recipe(clone: Path, capfd, monkeypatch) -> None:
    [fit] = recipe(clone, capfd, monkeypatch).run_all(blocks(EMA))
    assert "ema: an average of the weights (decay 0.9999" in fit.said
    assert (clone / "runs" / "multi30k_cpu" / "version_1" / "checkpoints" / "averaged.ckpt").is_file()


def test_the_subword_sampling_recipe(clone: Path, capfd, monkeypatch) -> None:
    [fit] = recipe(clone, capfd, monkeypatch).run_all(blocks(SUBWORDS))
    assert "subword sampling: BPE-dropout 0.1 on the training pairs, each epoch" in fit.said


def lines_of(path: Path, n: int) -> str:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return "".join(next(f) for _ in range(n))


def test_the_weighted_corpora_recipe(clone: Path, shared_data: Path, capfd, monkeypatch) -> None:
    """WMT14's three corpora stand-ins from other years' newstests, 100 pairs each, and 100 Multi30k pairs as the
    back-translated `raw/mono`, then the page's prepare and fit."""
    news = shared_data / "wmt_newstest_deen_other"
    for corpus, year in (("europarl_v7", 2008), ("commoncrawl", 2009), ("news_commentary_v9", 2010)):
        for lang in ("en", "de"):
            path = clone / "raw" / "wmt14_ende" / f"{corpus}.{lang}.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write(lines_of(news / f"newstest{year}.{lang}.gz", 100))
    for lang in ("en", "de"):
        (clone / "raw" / f"mono.{lang}").write_text(
            lines_of(clone / "raw" / "multi30k" / f"train.{lang}.gz", 100), encoding="utf-8"
        )
        path = clone / "raw" / "wmt14_ende_test" / f"newstest2013.{lang}.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(lines_of(shared_data / "wmt14_ende_test" / f"newstest2013.{lang}.gz", 50))
    prepare, fit = recipe(clone, capfd, monkeypatch).run_all(blocks(WEIGHTS))
    meta = json.loads((clone / "data" / "wmt14_mixed" / "meta.json").read_text(encoding="utf-8"))
    assert set(meta["splits"]["train"]["corpora"]) == {"europarl", "commoncrawl", "news", "bt"}
    assert (
        "corpus mix (data.corpus_weights {europarl: 1, commoncrawl: 1, news: 2, bt: 1}): asked " in fit.said
    )
    assert (clone / "runs" / "base" / "version_0" / "checkpoints" / "averaged.ckpt").is_file()


def test_the_activation_checkpointing_recipe(clone: Path, capfd, monkeypatch) -> None:
    """big.yaml trains on `data/wmt14_ende` (docs/wmt14.md prepares it): here the Multi30k slice stands in. The
    page's YAML is the `checkpointing.yaml` its `attnx describe` reads."""
    (clone / "data" / "wmt14_ende").symlink_to(clone / "data" / "multi30k")
    [listing] = [b for b in sections(PAGE)[CHECKPOINTING].split("```yaml\n")[1:]]
    (clone / "checkpointing.yaml").write_text(listing.split("```")[0], encoding="utf-8")
    fit, describe = recipe(clone, capfd, monkeypatch).run_all(blocks(CHECKPOINTING))
    assert yaml.safe_load((clone / "runs" / "big" / "version_0" / "config.yaml").read_text())["model"][
        "transformer"
    ]["activation_checkpointing"]
    assert " with activation checkpointing, " in describe.said and " without" in describe.said


@pytest.mark.slow  # a download, a corpus of 9,000 pairs prepared, a fit and two tests: some 25 s
def test_the_lora_recipe(clone: Path, capfd, monkeypatch) -> None:
    """From the README's run to adapters trained on news and both models scored: the in-domain corpus shares
    the parent's SentencePiece model, the run starts from its weights with the page's schedule."""
    ran = recipe(clone, capfd, monkeypatch).run_all(blocks(LORA))
    download, prepare, fit, parent, adapted = ran
    spm = (clone / "data" / "multi30k" / "spm.model").read_bytes()
    assert (clone / "data" / "news" / "spm.model").read_bytes() == spm
    assert "init_from: the weights of runs/multi30k_cpu/version_0/checkpoints/averaged.ckpt" in fit.said
    assert "lora: rank 8, alpha 16 on " in fit.said and "trainable parameters of " in fit.said
    config = yaml.safe_load((clone / "runs" / "multi30k_cpu" / "version_1" / "config.yaml").read_text())
    assert (config["model"]["warmup_steps"], config["model"]["lr_factor"]) == (100, 0.2)
    assert config["data"]["data_dir"] == "data/news" and config["lora"]["rank"] == 8
    for test in (parent, adapted):
        assert "sacreBLEU BLEU = " in test.said
    assert (clone / "runs" / "multi30k_cpu" / "version_0" / "test" / "averaged").is_dir()
    assert (clone / "runs" / "multi30k_cpu" / "version_1" / "test" / "averaged").is_dir()


def test_the_guided_alignment_recipe(clone: Path, capfd, monkeypatch) -> None:
    """eflomal's word links stand in as made-up ones (word i to word i, within each pair); then the page's
    prepare with them and its fit with the loss."""
    en, de = (
        gzip.decompress((clone / "raw" / "multi30k" / f"train.{lang}.gz").read_bytes()).decode().splitlines()
        for lang in ("en", "de")
    )
    pairs = zip(en, de, strict=True)
    links = [" ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split())))) for s, t in pairs]
    (clone / "train.align").write_text("\n".join(links) + "\n", encoding="utf-8")
    prepare, fit = recipe(clone, capfd, monkeypatch).run_all(blocks(ALIGNMENT), skip=NOT_RUN)
    assert "alignments: " in prepare.said and " piece links" in prepare.said
    with open(clone / "runs" / "multi30k_cpu" / "version_1" / "metrics.csv", newline="") as f:
        assert any(row.get("train/alignment_loss") for row in csv.DictReader(f))
