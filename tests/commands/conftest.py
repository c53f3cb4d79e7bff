"""The decoding fixtures (a tiny SentencePiece model and checkpoint) and the toy parallel corpus for the command
tests."""

import pytest

from tests.data.conftest import toy  # noqa: F401
from tests.inference.conftest import _one_thread, checkpoint, loaded, tokenizer  # noqa: F401


def stop_in_the_second_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """`attnx translate` (its chunks decoded by `TranslationJob.decode`) stopped by Ctrl+C as its second chunk
    begins; `monkeypatch.undo()` lets the next run go through."""
    from attnx.commands.streaming import TranslationJob

    decode = TranslationJob.decode

    def stopped(job, chunk, first):
        if first > 1:
            raise KeyboardInterrupt
        return decode(job, chunk, first)

    monkeypatch.setattr(TranslationJob, "decode", stopped)
