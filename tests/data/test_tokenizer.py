"""The tokenizer wrapper: attnx's special ids, its identity (SHA-256), and the one SentencePiece trainer call."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from attnx.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def english(shared_data: Path) -> list[str]:
    with gzip.open(shared_data / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(2000)]


def test_trained_in_memory_with_attnx_special_ids(english: list[str]) -> None:
    tokenizer = train_sentencepiece(300, sentences=english)
    sp = tokenizer.sp
    assert tokenizer.vocab_size == 300
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = tokenizer.encode(english[0])
    assert min(ids) > EOS_ID and tokenizer.decode([BOS_ID, *ids, EOS_ID]) == english[0]


def test_trained_from_files_writes_model_and_vocab(tmp_path: Path, english: list[str]) -> None:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(english) + "\n", encoding="utf-8")
    tokenizer = train_sentencepiece(
        300, files=[text], model_prefix=tmp_path / "spm", user_defined_symbols=["<BT>"]
    )
    model = tmp_path / "spm.model"
    assert (tmp_path / "spm.vocab").is_file()
    assert tokenizer.path == model
    assert tokenizer.sha256 == hashlib.sha256(model.read_bytes()).hexdigest()
    tag = tokenizer.sp.piece_to_id("<BT>")
    assert tag != UNK_ID and tag in tokenizer.encode("<BT> A dog")  # one piece
    assert Tokenizer.from_bytes(tokenizer.to_bytes()).sha256 == tokenizer.sha256


def test_needs_exactly_one_source_of_text(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="either sentences or files"):
        train_sentencepiece(100)
    with pytest.raises(ValueError, match="either sentences or files"):
        train_sentencepiece(100, sentences=["a"], files=[tmp_path / "x"])
