"""`attnx download` and `attnx prepare` as commands: their options are the library's settings, with the
library's defaults, and reach it unchanged (what the data they write looks like is tested in tests/data/)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.commands import data
from attnx.data.prepare import Settings


def test_every_prepare_setting_is_an_option_with_the_settings_default() -> None:
    options = inspect.signature(data.prepare).parameters
    for field in dataclasses.fields(Settings):
        assert field.name in options, f"Settings.{field.name} has no --{field.name} option"
        default = options[field.name].default
        if (
            field.name == "vocab_size"
        ):  # not given: the brought --spm_model's size, or Settings' when training
            assert default is None, f"--vocab_size defaults to {default!r}, not None"
            continue
        if field.default is not dataclasses.MISSING and field.default != ():
            assert default == field.default, (
                f"--{field.name} defaults to {default!r}, Settings to {field.default!r}"
            )


def test_prepare_options_reach_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def prepare_command(settings: Settings, **kwargs) -> int:
        seen.update(settings=settings, **kwargs)
        return 0

    monkeypatch.setattr("attnx.commands.prepare.prepare_command", prepare_command)
    argv = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--train", "[real, synthetic]"]
    argv += ["--train_repeat", "[2, 1]", "--train_tag", '["", "<BT>"]', "--vocab_size", "500"]
    argv += ["--drop_wrong_language", "false", "--output", str(tmp_path / "out"), "--test", "news=raw/news"]
    assert attnx(argv) == 0
    settings = seen["settings"]
    assert (settings.src_lang, settings.tgt_lang, settings.vocab_size) == ("en", "de", 500)
    assert settings.train_repeat == (2, 1) and settings.train_tag == ("", "<BT>")
    assert settings.drop_wrong_language is False and settings.drop_duplicates is True
    assert seen["train"] == ["real", "synthetic"] and seen["output"] == tmp_path / "out"
    assert seen["test"] == "news=raw/news" and seen["valid"] is None  # one prefix or a list, as given

    argv = [
        "prepare",
        "--src_lang",
        "en",
        "--tgt_lang",
        "de",
        "--train",
        "raw/x",
        "--output",
        str(tmp_path / "o"),
    ]
    assert attnx(argv) == 0
    assert seen["settings"].vocab_size == Settings.vocab_size  # no --vocab_size and no --spm_model: Settings'


def test_download_names_its_corpora_without_an_option_and_counts_what_it_wrote(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert attnx(["download", "multi30k", "--output", str(tmp_path), "--from_dir", str(shared_data)]) == 0
    written = sorted(p.name for p in (tmp_path / "multi30k").iterdir() if not p.name.startswith("."))
    assert f"multi30k: {len(written)} files in {tmp_path / 'multi30k'}" in capsys.readouterr().out
    assert "train.en.gz" in written and "test_2016_flickr.de.gz" in written
