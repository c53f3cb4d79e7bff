"""A folder as a clone is after the README's set-up command, at toy size, for the tests that run the docs'
recipes (tests/docs/recipes.py)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, SPLITS
from tests.docs.recipes import tiny_fit


@pytest.fixture(scope="session")
def readme_setup(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the README's set-up command leaves in a clone, small: `configs/`; `raw/multi30k/` as `attnx download
    multi30k` writes it, with the first 400 training and 50 validation and test pairs; `data/multi30k/`, those
    prepared (a 300-piece vocabulary: the session's `corpus`); and `runs/multi30k_cpu/version_0/`, the README's
    `attnx fit --config configs/multi30k_cpu.yaml` with `tiny_fit.yaml` (beside it) over it: a tiny model,
    6 steps, its last 3 checkpoints averaged."""
    from attnx.cli import main as attnx

    work = tmp_path_factory.mktemp("readme_setup")
    (work / "configs").symlink_to(REPO / "configs")
    raw = work / "raw" / "multi30k"
    raw.mkdir(parents=True)
    for split in SPLITS:
        for lang in ("en", "de"):
            with gzip.open(raw / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write((corpus.parent / f"{split}.{lang}").read_text(encoding="utf-8"))
    shutil.copytree(corpus, work / "data" / "multi30k")
    (work / "tiny_fit.yaml").write_text(tiny_fit(), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        assert attnx(["fit", "--config", "configs/multi30k_cpu.yaml", "--config", "tiny_fit.yaml"]) == 0
    assert (work / "runs" / "multi30k_cpu" / "version_0" / "checkpoints" / "averaged.ckpt").is_file()
    return work


@pytest.fixture
def clone(readme_setup: Path, tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of `readme_setup` of the test's own, with `ATTNX_DATA_DIR` set to the shared corpora, as the
    README's set-up command reads it (`attnx download --from_dir`)."""
    work = tmp_path / "clone"
    shutil.copytree(readme_setup, work, symlinks=True)
    monkeypatch.setenv("ATTNX_DATA_DIR", str(shared_data))
    return work
