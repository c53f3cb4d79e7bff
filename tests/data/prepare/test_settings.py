"""Prepare's settings: SentencePiece's symbols, the settings that decide whether its model is reused, and the input
files found from their prefixes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from attnx.data.errors import DataError
from attnx.data.prepare.settings import Inputs, Settings
from tests.data.conftest import write

SPM = {"vocab_size", "sample_size", "character_coverage", "seed", "user_defined_symbols", "train_tag"}
CLEANING = {"drop_duplicates", "drop_copies", "drop_wrong_language"}
"""What shapes SentencePiece's model: its own settings, and the cleaning, which decides its training text."""
ENCODING = {"src_lang", "tgt_lang", "max_sentence_tokens", "max_ratio", "train_repeat"}
"""What does not: the languages name the input files (which are fingerprinted themselves), the length filters
and repeats apply after SentencePiece is trained."""


def test_symbols_are_the_given_ones_then_the_tags_each_once() -> None:
    settings = Settings(
        "en", "de", user_defined_symbols=("<x>", "<BT>"), train_tag=("", "<BT>", "<FT>", "<FT>")
    )
    assert settings.symbols() == ["<x>", "<BT>", "<FT>"]
    assert Settings("en", "de", train_tag=("", "")).symbols() == []
    assert Settings("en", "de", train_tag=("<FT>", "", "<BT>")).symbols() == ["<FT>", "<BT>"]


def test_every_setting_either_shapes_the_sentencepiece_model_or_is_named_as_not() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert fields == SPM | CLEANING | ENCODING, (
        "a new setting: say whether SentencePiece must be retrained for it"
    )
    settings = Settings("en", "de", user_defined_symbols=("<x>",), train_tag=("<BT>",))
    assert settings.spm_part() == {k: getattr(settings, k) for k in SPM | CLEANING}


@pytest.mark.parametrize(
    ("change", "retrain"),
    [
        ({"vocab_size": 500}, True),
        ({"seed": 2}, True),
        ({"train_tag": ("<BT>",)}, True),
        ({"user_defined_symbols": ("<x>",)}, True),
        ({"drop_copies": False}, True),
        ({"drop_wrong_language": False}, True),
        ({"max_ratio": 1.5}, False),
        ({"max_sentence_tokens": 8}, False),
        ({"train_repeat": (3,)}, False),
    ],
    ids=lambda v: ",".join(v) if isinstance(v, dict) else str(v),
)
def test_spm_part_changes_with_what_retrains_sentencepiece(change: dict[str, object], retrain: bool) -> None:
    settings = Settings("en", "de")
    assert (dataclasses.replace(settings, **change).spm_part() != settings.spm_part()) is retrain


def test_inputs_resolve_each_prefix_to_its_plain_or_gzipped_files(tmp_path: Path) -> None:
    write(tmp_path / "a.en", ["x"])
    write(tmp_path / "a.de", ["y"], gz=True)
    write(tmp_path / "b.en", ["x"], gz=True)
    write(tmp_path / "b.en", ["x"])  # both: the plain file
    write(tmp_path / "b.de", ["y"])
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    inputs = Inputs.from_prefixes({"train": [a, b], "test": [b]}, "en", "de")
    assert inputs.splits == {
        "train": ([tmp_path / "a.en", tmp_path / "b.en"], [tmp_path / "a.de.gz", tmp_path / "b.de"]),
        "test": ([tmp_path / "b.en"], [tmp_path / "b.de"]),
    }
    assert Inputs().splits == {}


def test_a_missing_input_file_is_an_error_naming_both_candidates(tmp_path: Path) -> None:
    write(tmp_path / "a.en", ["x"])
    expected = (
        f"no de file for {tmp_path / 'a'}: neither {tmp_path / 'a.de'} nor {tmp_path / 'a.de.gz'} exists"
    )
    with pytest.raises(DataError) as raised:
        Inputs.from_prefixes({"train": [str(tmp_path / "a")]}, "en", "de")
    assert str(raised.value) == expected
    (tmp_path / "a.de").mkdir()  # a directory is no file
    with pytest.raises(DataError, match="no de file for"):
        Inputs.from_prefixes({"train": [str(tmp_path / "a")]}, "en", "de")
