from __future__ import annotations

import gzip
import urllib.error
from pathlib import Path

from attnx.cli import main as attnx
from attnx.data import download
from attnx.data.download import CORPORA

from .conftest import write


def main(argv: list[str]) -> int:
    return attnx(["download", *argv])


def test_from_dir_copies_the_shared_layout(shared_data: Path, tmp_path: Path, capsys) -> None:
    assert (
        main(["multi30k", "wmt14_ende_test", "--output", str(tmp_path), "--from_dir", str(shared_data)]) == 0
    )
    assert "multi30k: 6 files" in capsys.readouterr().out
    for corpus in ("multi30k", "wmt14_ende_test"):
        for dest in download.targets(corpus, tmp_path):
            assert dest.read_bytes() == (shared_data / corpus / dest.name).read_bytes()


def test_from_dir_links_or_gzips_plain_files(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for split in CORPORA["multi30k"]:
        write(source / "multi30k" / f"{split}.en", [f"{split} en"], gz=True)
        write(source / "multi30k" / f"{split}.de", [f"{split} de"])  # plain: gzipped on the way
    assert main(["multi30k", "--output", str(tmp_path / "out"), "--from_dir", str(source), "--link"]) == 0
    out = tmp_path / "out" / "multi30k"
    assert (out / "train.en.gz").is_symlink()
    assert gzip.decompress((out / "val.de.gz").read_bytes()) == b"val de\n"


def test_from_dir_names_missing_files(tmp_path: Path, capsys) -> None:
    write(tmp_path / "src" / "multi30k" / "train.en", ["x"], gz=True)
    assert main(["multi30k", "--output", str(tmp_path / "out"), "--from_dir", str(tmp_path / "src")]) == 1
    err = capsys.readouterr().err
    assert "lacks 5 file(s) of multi30k" in err and "train.de.gz" in err and "Traceback" not in err


def test_offline_download_says_to_use_from_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    assert main(["multi30k", "--output", str(tmp_path)]) == 1
    assert "--from_dir" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.part")) and not list(tmp_path.rglob(".attnx-download-*"))


def test_url_table_matches_the_wmt14_recipe() -> None:
    assert set(CORPORA) == {"multi30k", "wmt14_ende", "wmt14_ende_test"}
    assert CORPORA["multi30k"]["train"].url.endswith("multi30k/dataset/master/data/task1/raw/train.{lang}.gz")
    urls = {split: source.url for split, source in CORPORA["wmt14_ende"].items()}
    assert urls == {
        "europarl_v7": "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "commoncrawl": "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "news_commentary_v9": "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    }
    assert (
        CORPORA["wmt14_ende_test"]["newstest2014"].sacrebleu == "wmt14/full"
    )  # 3,003 lines, as in the paper
    for source in CORPORA["wmt14_ende"].values():
        assert all("{lang}" in member for member in source.members)


def test_archive_members_become_gzipped_splits(tmp_path: Path, monkeypatch) -> None:
    """The tar path of the WMT14 corpora, on a local archive reached through a file:// URL."""
    import io
    import tarfile

    archive = tmp_path / "training-parallel-toy.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for lang in ("en", "de"):
            data = f"one {lang}\ntwo {lang}\n".encode()
            info = tarfile.TarInfo(f"training/toy.de-en.{lang}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    source = download.Source(url=archive.as_uri(), members=("training/toy.de-en.{lang}",))
    monkeypatch.setitem(CORPORA, "toy", {"toy_v1": source})
    users = tmp_path / "out" / "toy" / "downloads" / "notes.txt"  # a folder the user keeps there
    users.parent.mkdir(parents=True)
    users.write_text("mine")
    written = download.download("toy", tmp_path / "out")
    assert [p.name for p in written] == ["toy_v1.en.gz", "toy_v1.de.gz"]
    assert gzip.decompress(written[1].read_bytes()) == b"one de\ntwo de\n"
    assert users.read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "out" / "toy").iterdir()) == [
        ".attnx-download.json",
        "downloads",
        "toy_v1.de.gz",
        "toy_v1.en.gz",
    ]


def test_a_file_attnx_did_not_write_is_refused_and_kept(shared_data: Path, tmp_path: Path, capsys) -> None:
    mine = tmp_path / "multi30k" / "val.de.gz"
    mine.parent.mkdir()
    mine.write_bytes(b"the user's own file")
    assert main(["multi30k", "--output", str(tmp_path), "--from_dir", str(shared_data)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "val.de.gz exists and attnx download did not write it" in err
    assert mine.read_bytes() == b"the user's own file"
    assert sorted(p.name for p in mine.parent.iterdir()) == ["val.de.gz"]  # nothing else was written


def test_its_own_files_are_replaced_and_a_changed_one_is_refused(
    shared_data: Path, tmp_path: Path, capsys
) -> None:
    args = ["multi30k", "--output", str(tmp_path), "--from_dir", str(shared_data)]
    assert main(args) == 0
    assert main(args) == 0  # the second run replaces what the first wrote
    edited = tmp_path / "multi30k" / "train.en.gz"
    edited.write_bytes(gzip.compress(b"edited by hand\n"))
    capsys.readouterr()
    assert main(args) == 1
    assert (
        "train.en.gz exists and attnx download did not write it (or it changed since)"
        in capsys.readouterr().err
    )
    assert gzip.decompress(edited.read_bytes()) == b"edited by hand\n"
    leftovers = [p.name for p in (tmp_path / "multi30k").iterdir() if p.name.startswith(".attnx-download-")]
    assert not leftovers


def test_copying_a_directory_onto_itself_is_refused(shared_data: Path, tmp_path: Path, capsys) -> None:
    raw = tmp_path / "raw"
    assert main(["multi30k", "--output", str(raw), "--from_dir", str(shared_data)]) == 0
    before = {p.name: p.read_bytes() for p in (raw / "multi30k").glob("*.gz")}
    capsys.readouterr()
    assert main(["multi30k", "--output", str(raw), "--from_dir", str(raw)]) == 1
    assert "copied onto itself" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (raw / "multi30k").glob("*.gz")} == before
