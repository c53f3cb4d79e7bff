"""The chunk loop of attnx translate: paired files, per-chunk sampling seeds, truncation numbered across chunks."""

from __future__ import annotations

import pytest

from attnx.commands.resumable import ResumableOutput
from attnx.commands.streaming import (
    CHUNK_SEED_MAX,
    LineCountMismatch,
    PairedInputs,
    Truncated,
    check_output_options,
    chunk_seed,
    run_options,
)
from attnx.commands.text_input import TextInput
from attnx.inference.config import SearchConfig


def test_paired_files_are_read_line_for_line_and_counted_before_anything(tmp_path):
    src, tgt = tmp_path / "in.txt", tmp_path / "tgt.txt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    tgt.write_text("A\nB\nC\n", encoding="utf-8")
    with PairedInputs(str(src), target=str(tgt)) as inputs:
        inputs.check_line_counts()
        assert inputs.read(2) == {"input": ["a", "b"], "target": ["A", "B"]}
        assert inputs.read(2) == {"input": ["c"], "target": ["C"]}
        assert inputs.read(2) == {}
    tgt.write_text("A\n", encoding="utf-8")
    with PairedInputs(str(src), target=str(tgt)) as inputs, pytest.raises(LineCountMismatch) as err:
        inputs.check_line_counts()
    assert (
        str(err.value)
        == f"--input {src} has 3 lines but --target {tgt} has 1; they must pair up line by line"
    )


def test_every_chunk_samples_from_its_own_seed_and_a_rerun_from_the_same():
    """Every chunk's seed fits every engine's generator: CTranslate2's takes 32 bits (a 63-bit seed refused
    every seeded run of an export), torch's 64."""
    seeds = {chunk_seed(1, first) for first in (1, 2001, 4001)} | {chunk_seed(2, 1)}
    assert len(seeds) == 4 and chunk_seed(1, 2001) == chunk_seed(1, 2001)
    assert CHUNK_SEED_MAX == 2**32 - 1
    largest = [chunk_seed(seed, 1) for seed in (2**32, 2**64 - 1)]
    assert all(0 <= s <= CHUNK_SEED_MAX for s in [*seeds, *largest])


def test_truncated_lines_are_numbered_across_chunks():
    cut = Truncated(max_positions=4, what="input")
    assert cut.cut([[1, 2, 3, 4], [1]], first_line=1) == [[1, 2, 3], [1]]
    cut.cut([[1], [1, 2, 3, 4, 5]], first_line=3)
    assert (
        cut.warning()
        == "2 input(s) exceed the model's 4 positions and were truncated to 3 tokens: input 1, 4"
    )


def test_options_that_would_drop_what_was_asked_are_refused():
    check_output_options("jsonl", None, None, True, SearchConfig(beam=4, nbest=4))
    check_output_options("text", None, None, False, SearchConfig(beam=4, nbest=2))  # Marian's n-best lines
    for args, words in [
        (("text", None, None, True, None), "--token_scores needs"),
        (("jsonl", "t.txt", "p.txt", False, None), "give one of them"),
        (("jsonl", "t.txt", None, False, SearchConfig(sampling=True)), "do not apply"),
    ]:
        with pytest.raises(ValueError, match=words):
            check_output_options(*args)


def test_seeded_sampling_keeps_its_grouping_and_other_searches_do_not_need_to(tmp_path):
    """Each chunk of --buffer_size lines samples from its own seed, and its batches of --max_tokens from one
    stream: a seeded run continued with another grouping would match neither run, so it starts over, saying
    why. A beam search decides each line alone: its record leaves the grouping out and a resume goes on."""
    src = tmp_path / "in.txt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    model = str(tmp_path / "model.ckpt")
    seeded = SearchConfig(sampling=True, seed=7)

    def resume(search: SearchConfig | None, buffer_size: int) -> str | None:
        options = run_options(model, None, search, "text", False, None, buffer_size, 1000)
        out = ResumableOutput(tmp_path / "out.txt", options)
        out.prepare()
        with TextInput(src) as text:
            message = out.start({"input": text})
            if buffer_size == 2:  # the first run: two lines written, then stopped
                text.read(2)
                out.write(b"A\nB\n", {"input": text})
            out.file.close()
        return message

    for search in (seeded, SearchConfig(beam=2), None):
        for name in ("out.txt.attnx-partial", "out.txt.attnx-partial.json"):
            (tmp_path / name).unlink(missing_ok=True)
        resume(search, 2)
        message = resume(search, 3)
        if search is seeded:
            assert message.startswith("starting over:") and "buffer_size 2 -> 3" in message, message
        else:
            assert message == (
                f"continuing after the 2 line(s) already in {tmp_path / 'out.txt.attnx-partial'} (same input "
                "and options)"
            )
    assert run_options(model, None, seeded, "text", False, None, 5, 800)["max_tokens"] == 800
