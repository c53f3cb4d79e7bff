"""DataError: what the data pipeline raises for input that cannot become a corpus, printed as one line
naming the file, exit status 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.data.corpus import PreparedCorpus
from attnx.data.errors import DataError
from attnx.errors import AttnxError


def test_a_data_error_is_a_failure_with_exit_status_1_and_a_value_error_to_python() -> None:
    assert issubclass(DataError, AttnxError) and issubclass(DataError, ValueError)
    assert DataError("train.en line 3: not UTF-8").exit_code == 1


@pytest.mark.parametrize(
    ("meta", "said"),
    [("{not json", "is not valid JSON"), ('["a list"]', "is not a prepared corpus's meta")],
)
def test_a_damaged_corpus_names_its_file_and_what_to_run(tmp_path: Path, meta: str, said: str) -> None:
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(DataError, match=said) as raised:
        PreparedCorpus(tmp_path)
    assert str(tmp_path / "meta.json") in str(raised.value) and "attnx prepare" in str(raised.value)


def test_the_command_prints_it_as_one_line_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "meta.json").write_text("{not json")
    argv = ["fit", "--config", "tiny", "--data.data_dir", str(tmp_path), "--trainer.max_steps", "1"]
    assert attnx(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and f"{tmp_path / 'meta.json'} is not valid JSON" in lines[0]
    assert "Traceback" not in err
