"""What a SentencePiece model records: the paths of its training kept out of its bytes, and the identity of the
model as a tokenizer (pieces, scores, types, normalization) apart from what its training recorded."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from attnx.data.sentencepiece_proto import (
    parse,
    segmentation_difference,
    segmentation_digest,
    stable_proto,
)
from attnx.data.tokenizer import train_sentencepiece


@pytest.fixture(scope="module")
def proto(shared_data: Path) -> bytes:
    with gzip.open(shared_data / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as f:
        english = [next(f).strip() for _ in range(500)]
    return train_sentencepiece(200, sentences=english).to_bytes()


def changed(proto: bytes, change: Callable[[Any], None]) -> bytes:
    model = parse(proto)
    change(model)
    return model.SerializeToString()


def test_stable_proto_keeps_names_not_folders_and_not_the_threads(proto: bytes) -> None:
    def trained_elsewhere(model: Any) -> None:
        model.trainer_spec.input.extend(["/home/a/run/.attnx-prepare-1x2y/train.en", "/x/train.de"])
        model.trainer_spec.model_prefix = "/home/a/run/.attnx-prepare-1x2y/spm"
        model.trainer_spec.num_threads = 64

    here = stable_proto(
        changed(proto, trained_elsewhere), ["/home/a/.attnx-prepare-1/train.en", "/y/train.de"], "/z/spm"
    )
    there = stable_proto(changed(proto, trained_elsewhere), ["/b/train.en", "train.de"], Path("q/spm"))
    assert here == there
    spec = parse(here).trainer_spec
    assert list(spec.input) == ["train.en", "train.de"] and spec.model_prefix == "spm"
    assert not spec.HasField("num_threads")
    assert b".attnx-prepare-" not in here
    # the model itself is untouched: same pieces, same cut
    a, b = spm.SentencePieceProcessor(model_proto=proto), spm.SentencePieceProcessor(model_proto=here)
    text = "Two young guys with shaggy hair look at their hands."
    assert a.encode(text) == b.encode(text)
    assert segmentation_digest(here) == segmentation_digest(proto)


def test_what_only_the_training_recorded_does_not_change_the_identity(proto: bytes) -> None:
    def trained_otherwise(model: Any) -> None:
        model.trainer_spec.input.append("/elsewhere/train.en")
        model.trainer_spec.input_sentence_size = 12345
        model.trainer_spec.num_threads = 3
        model.normalizer_spec.add_dummy_prefix = (
            model.normalizer_spec.add_dummy_prefix
        )  # written at its default

    other = changed(proto, trained_otherwise)
    assert other != proto
    assert segmentation_digest(other) == segmentation_digest(proto)
    assert segmentation_difference(proto, other) == ""


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda m: setattr(m.pieces[10], "score", m.pieces[10].score - 1), "piece 10 score"),
        (lambda m: setattr(m.pieces[12], "piece", "▁zzz"), "piece 12 text: "),
        (lambda m: setattr(m.pieces[14], "type", 4), "piece 14 type: 'NORMAL' vs 'USER_DEFINED'"),
        (lambda m: m.pieces.pop(), "200 vs 199 pieces"),
        (
            lambda m: setattr(m.normalizer_spec, "add_dummy_prefix", False),
            "normalizer add_dummy_prefix: True vs False",
        ),
        (
            lambda m: setattr(m.normalizer_spec, "remove_extra_whitespaces", False),
            "normalizer remove_extra_whitespaces: True vs False",
        ),
        (
            lambda m: setattr(m.normalizer_spec, "normalization_rule_tsv", "41\t61\n"),
            "normalizer normalization_rule_tsv",
        ),
        (
            lambda m: setattr(m.normalizer_spec, "precompiled_charsmap", b"x"),
            "normalizer precompiled_charsmap differs",
        ),
        (lambda m: setattr(m.trainer_spec, "byte_fallback", True), "trainer byte_fallback: False vs True"),
        (lambda m: setattr(m.trainer_spec, "unk_surface", "?"), "trainer unk_surface"),
        (lambda m: setattr(m.trainer_spec, "treat_whitespace_as_suffix", True), "treat_whitespace_as_suffix"),
    ],
)
def test_what_decides_the_segmentation_changes_the_identity(
    proto: bytes, change: Callable[[Any], None], said: str
) -> None:
    other = changed(proto, change)
    assert segmentation_digest(other) != segmentation_digest(proto)
    assert said in segmentation_difference(proto, other)
