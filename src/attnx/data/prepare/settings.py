"""What a prepare run is given: the input files of each split and the settings that shape the corpus."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnx.data.text import resolve

TRAIN = "train"


@dataclass
class Settings:
    """Everything that determines the prepared corpus besides the input files."""

    src_lang: str
    tgt_lang: str
    vocab_size: int = 8000
    max_sentence_tokens: int = 250
    max_ratio: float = 3.0
    sample_size: int = 10_000_000
    character_coverage: float = 1.0
    seed: int = 1
    drop_duplicates: bool = True
    drop_copies: bool = True
    drop_wrong_language: bool = True
    user_defined_symbols: tuple[str, ...] = ()
    """Pieces SentencePiece keeps whole wherever they occur (besides every `train_tag`)."""
    train_repeat: tuple[int, ...] = ()
    """Per training corpus, how many times its kept pairs go into the training split (upsampling); () is once each."""
    train_tag: tuple[str, ...] = ()
    """Per training corpus, a token put before each source sentence ("" for none), kept whole; () is none."""

    def spm_part(self) -> dict[str, Any]:
        """The settings that shape SentencePiece's training text and model."""
        keys = (
            "vocab_size",
            "sample_size",
            "character_coverage",
            "seed",
            "user_defined_symbols",
            "train_tag",
        )
        return {k: getattr(self, k) for k in keys + CLEANING}

    def symbols(self) -> list[str]:
        """SentencePiece's `user_defined_symbols`: the given ones, then the tags."""
        return list(dict.fromkeys([*self.user_defined_symbols, *filter(None, self.train_tag)]))


CLEANING = ("drop_duplicates", "drop_copies", "drop_wrong_language")


@dataclass
class Inputs:
    """Split name → (source files, target files); train may concatenate several corpora."""

    splits: dict[str, tuple[list[Path], list[Path]]] = field(default_factory=dict)
    train_names: list[str] = field(default_factory=list)
    """The name of each training corpus (`--train NAME=PREFIX`), or [] to name each by its prefix."""
    alignments: dict[str, list[Path]] = field(default_factory=dict)
    """Split name → word alignment files in Pharaoh format, one per corpus of the split ([attnx.data.prepare.alignments][])."""

    @classmethod
    def from_prefixes(cls, prefixes: dict[str, list[str]], src_lang: str, tgt_lang: str) -> Inputs:
        splits = {}
        for name, ps in prefixes.items():
            splits[name] = ([resolve(p, src_lang) for p in ps], [resolve(p, tgt_lang) for p in ps])
        return cls(splits)
