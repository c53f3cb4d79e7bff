"""The decoding fixtures (a tiny SentencePiece model and checkpoint) and the toy parallel corpus for the command
tests."""

from tests.data.conftest import toy  # noqa: F401
from tests.inference.conftest import _one_thread, checkpoint, loaded, tokenizer  # noqa: F401
