"""Fixtures of a small model trained for a few hundred steps on real Multi30k text, for every test that
compares another engine or an exported model with attnx's own decoding (tests/export/, the CTranslate2 engine's
tests/inference/test_ctranslate2.py). Registered once for the whole session from tests/conftest.py, so the
model is trained once however many folders use it.

The model must behave like a trained one (its translations end with ``</s>``, its probabilities are peaked)
without costing more than a few seconds: 4,000 training pairs, a 1,000-piece joint BPE, d_model 64, 2+2 layers,
300 Adam steps of ~1,000 tokens on one thread (about three epochs of the slice).
"""

from __future__ import annotations

import gzip
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from attnx.components.loss import translation_loss
from attnx.data.batching import collate_indices, plan_batches
from attnx.data.corpus import PreparedCorpus
from attnx.data.prepare import Inputs, Settings, prepare
from attnx.model import TransformerConfig, build_transformer
from tests.checkpoints import save_model

TRAIN_PAIRS = 4000
TEST_PAIRS = 200
STEPS = 300


def _head(source: Path, target: Path, n: int) -> None:
    with gzip.open(source, "rt", encoding="utf-8") as f:
        target.write_text("".join(itertools.islice(f, n)), encoding="utf-8")


@pytest.fixture(scope="session")
def trained_corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedCorpus:
    """The first 4,000 Multi30k training pairs and 200 test_2016_flickr pairs, prepared (1,000-piece BPE)."""
    raw = tmp_path_factory.mktemp("multi30k_slice")
    for split, name, n in [("train", "train", TRAIN_PAIRS), ("test", "test_2016_flickr", TEST_PAIRS)]:
        for lang in ("en", "de"):
            _head(shared_data / "multi30k" / f"{name}.{lang}.gz", raw / f"{split}.{lang}", n)
    out = tmp_path_factory.mktemp("prepared")
    inputs = Inputs.from_prefixes({"train": [raw / "train"], "test": [raw / "test"]}, "en", "de")
    prepare(inputs, out, Settings("en", "de", vocab_size=1000), workers=1)
    return PreparedCorpus(out)


@pytest.fixture(scope="session")
def trained(trained_corpus: PreparedCorpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoint of the small model after 300 Adam steps (fixed seeds), written by ``save_model``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(1)
        config = TransformerConfig(
            vocab_size=trained_corpus.vocab_size,
            d_model=64,
            n_heads=4,
            d_ff=128,
            encoder_layers=2,
            decoder_layers=2,
            dropout=0.1,
            max_len=128,
        )
        model = build_transformer(config).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98), eps=1e-9)
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda taken: min(1.0, (taken + 1) / 50))
        train = trained_corpus.dataset("train")
        order, bounds = plan_batches(train.src_lengths, train.tgt_lengths, max_tokens=1000, seed=1)
        batches = [order[bounds[k] : bounds[k + 1]] for k in range(len(bounds) - 1)]
        rng = np.random.default_rng(1)
        step = 0
        while step < STEPS:
            for k in rng.permutation(len(batches)):
                sums = translation_loss(model, collate_indices(train, batches[k]), 0.1)
                optimizer.zero_grad(set_to_none=True)
                (sums.loss / sums.tokens).backward()
                optimizer.step()
                warmup.step()
                step += 1
                if step == STEPS:
                    break
        path = tmp_path_factory.mktemp("trained") / "multi30k_small.ckpt"
        save_model(path, model.eval(), config, trained_corpus.tokenizer)
        return path
    finally:
        torch.set_num_threads(threads)


@dataclass
class Pairs:
    """The 200 test pairs: source and reference ids (no BOS/EOS) and the source text."""

    sources: list[list[int]]
    references: list[list[int]]
    lines: list[str]


@pytest.fixture(scope="session")
def test_set(trained_corpus: PreparedCorpus) -> Pairs:
    test = trained_corpus.dataset("test")
    pairs = [test[i] for i in range(len(test))]
    return Pairs(
        sources=[src.tolist() for src, _ in pairs],
        references=[tgt.tolist() for _, tgt in pairs],
        lines=trained_corpus.sources("test"),
    )


@pytest.fixture(scope="session")
def ct2_export(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained model exported once to CTranslate2 (fp32), for the exporter's and the engine's tests."""
    from attnx.export.ctranslate2 import export_ctranslate2

    return export_ctranslate2(trained, tmp_path_factory.mktemp("ct2") / "fp32")


@pytest.fixture(scope="session")
def ct2_translator(ct2_export: Path):
    """The CTranslate2 engine over [`ct2_export`][tests.trained.ct2_export], one thread."""
    from attnx.inference.ctranslate2 import CTranslate2Translator

    return CTranslate2Translator.load(ct2_export, threads=1)
