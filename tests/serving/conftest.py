"""The decoding fixtures (a tiny SentencePiece model and checkpoint) for the server tests."""

from tests.inference.conftest import _one_thread, checkpoint, loaded, tokenizer  # noqa: F401
