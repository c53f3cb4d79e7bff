"""The chunk loop of attnx translate: paired files, per-chunk sampling seeds, truncation numbered across chunks."""

from __future__ import annotations

import pytest

from attnx.commands.streaming import (
    LineCountMismatch,
    PairedInputs,
    Truncated,
    check_output_options,
    chunk_seed,
)
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
    seeds = {chunk_seed(1, first) for first in (1, 2001, 4001)} | {chunk_seed(2, 1)}
    assert len(seeds) == 4 and chunk_seed(1, 2001) == chunk_seed(1, 2001)
    assert all(0 <= s < 2**63 for s in seeds)


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
    for args, words in [
        (("text", None, None, False, SearchConfig(beam=4, nbest=2)), "--format jsonl or --format moses"),
        (("text", None, None, True, None), "--token_scores needs"),
        (("jsonl", "t.txt", "p.txt", False, None), "give one of them"),
        (("jsonl", "t.txt", None, False, SearchConfig(sampling=True)), "do not apply"),
    ]:
        with pytest.raises(ValueError, match=words):
            check_output_options(*args)
