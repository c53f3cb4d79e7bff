"""The `--report` file: prepare's own, also inside the output directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_report_inside_the_output_is_prepares_own(toy: Path, tmp_path: Path) -> None:
    """`--report OUT/report.md`, then the same command: the corpus is reused and the report rewritten (it was
    refused as a file prepare did not write); a rebuild keeps it too, and a user's file beside it is refused."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de", "--train",
               str(toy / "train"), "--vocab_size", "60", "--drop_wrong_language", "false", "--output", str(out),
               "--report", str(out / "report.md")]  # fmt: skip
    for word in ("prepared", "reused"):
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0 and word in result.stdout, result.stderr
        assert (out / "report.md").read_text().startswith("# attnx prepare: what cleaning dropped")
    other_vocabulary = [("61" if arg == "60" else arg) for arg in command[:-2]]  # without --report: kept too
    rebuilt = subprocess.run(other_vocabulary, capture_output=True, text=True)
    assert rebuilt.returncode == 0 and (out / "report.md").is_file(), rebuilt.stderr
    (out / "notes.md").write_text("# my notes\n")
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 1 and "did not write (notes.md)" in refused.stderr
