"""`attnx download`: fetch the raw parallel text of Multi30k and WMT14 English-German.

Every corpus lands in one layout, the one `attnx prepare` reads: `{out}/{corpus}/{split}.{lang}.gz`, line i of
the `en` file aligned with line i of the `de` file.

=====================  =====================================================================================
corpus                 splits (source)
=====================  =====================================================================================
`multi30k`           train, val, test_2016_flickr — github.com/multi30k/dataset, `data/task1/raw`
`wmt14_ende`         europarl_v7, commoncrawl, news_commentary_v9 — the statmt.org archives of WMT14's
                       English-German training data (the same ones fairseq's prepare-wmt14en2de.sh uses), 4.5M pairs
`wmt14_ende_test`    newstest2013 (the paper's development set), newstest2014 (the full 3,003-line test set
                       the paper reports on) — through sacreBLEU (`-t wmt13`, `-t wmt14/full`, `-l en-de`)
=====================  =====================================================================================

Without network access, `--from_dir DIR` copies (or with `--link`, symlinks) the same files from a local
directory in this layout, e.g. a shared data folder; that is also how tests and CI use this command.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from attnx.data.errors import DataError
from attnx.files import move_into_place, scratch_directory

LANGS = ("en", "de")
MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
STATMT = "http://statmt.org"


@dataclass(frozen=True)
class Source:
    """Where one split comes from: a gzipped file per language, members of a tar archive, or a sacreBLEU test set."""

    url: str = ""  # with `{lang}` for per-language files; an archive's URL otherwise
    members: tuple[str, ...] = ()  # archive members, one per language (with `{lang}`)
    sacrebleu: str = ""  # sacreBLEU test set name; language pair en-de


CORPORA: dict[str, dict[str, Source]] = {
    "multi30k": {
        split: Source(url=f"{MULTI30K}/{split}.{{lang}}.gz") for split in ("train", "val", "test_2016_flickr")
    },
    "wmt14_ende": {
        "europarl_v7": Source(
            url=f"{STATMT}/wmt13/training-parallel-europarl-v7.tgz",
            members=("training/europarl-v7.de-en.{lang}",),
        ),
        "commoncrawl": Source(
            url=f"{STATMT}/wmt13/training-parallel-commoncrawl.tgz", members=("commoncrawl.de-en.{lang}",)
        ),
        "news_commentary_v9": Source(
            url=f"{STATMT}/wmt14/training-parallel-nc-v9.tgz",
            members=("training/news-commentary-v9.de-en.{lang}",),
        ),
    },
    "wmt14_ende_test": {
        "newstest2013": Source(sacrebleu="wmt13"),
        "newstest2014": Source(sacrebleu="wmt14/full"),
    },
}

OFFLINE_HINT = (
    "this machine may be offline: copy the files from a local directory with "
    "`attnx download --from_dir DIR ...` (layout DIR/{corpus}/{split}.{lang}.gz)"
)


def targets(corpus: str, out: Path) -> list[Path]:
    return [out / corpus / f"{split}.{lang}.gz" for split in CORPORA[corpus] for lang in LANGS]


# --- writing only what is ours --------------------------------------------------------------------------

SCRATCH_PREFIX = ".attnx-download-"
"""Starts the name of the scratch directory a download writes in, inside the corpus folder."""

MANIFEST = ".attnx-download.json"
"""In each `{out}/{corpus}` folder: the files `attnx download` wrote there and their SHA-256, so a later
download replaces those (unchanged) and never a file someone else put there."""


def _digest(path: Path) -> str:
    """SHA-256 of a file, or `link:TARGET` for a symbolic link (what `--link` writes)."""
    if path.is_symlink():
        return f"link:{os.readlink(path)}"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class Folder:
    """One corpus folder that `attnx download` writes into: it refuses, before anything is fetched, a target
    that exists and that it did not write (or that was changed since), and works in a private scratch
    directory that it alone removes."""

    def __init__(self, corpus: str, out: Path) -> None:
        self.path = out / corpus
        self.manifest = self.path / MANIFEST
        self.owned: dict[str, str] = {}
        if self.manifest.is_file():
            try:
                self.owned = dict(json.loads(self.manifest.read_text(encoding="utf-8"))["files"])
            except (ValueError, KeyError, TypeError):
                raise DataError(
                    f"{self.manifest} is damaged, so attnx cannot tell its files from others in {self.path}; "
                    "move that folder away, or choose another --output"
                ) from None
        self.verified = {dest.name for dest in targets(corpus, out) if self.check(dest)}
        """Targets that exist and were found to be attnx's, hashed once here rather than again at install."""

    def check(self, dest: Path) -> bool:
        """Whether `dest` exists (then it is attnx's, unchanged); raises if it exists and is not."""
        if not dest.exists() and not dest.is_symlink():
            return False
        if dest.is_dir() and not dest.is_symlink():
            raise DataError(
                f"{dest} is a directory; attnx download writes a file there. Move it or choose another --output"
            )
        if self.owned.get(dest.name) != _digest(dest):
            raise DataError(
                f"{dest} exists and attnx download did not write it (or it changed since); it is left as it is. "
                "Move it away, or choose another --output"
            )
        return True

    def scratch(self) -> contextlib.AbstractContextManager[Path]:
        """A private directory inside the corpus folder (same file system: files move in with a rename)."""
        return scratch_directory(self.path, SCRATCH_PREFIX)

    def install(self, written: Path, dest: Path) -> Path:
        """Move a finished file from the scratch directory to `dest` and record it as attnx's."""
        if dest.name not in self.verified:
            self.check(dest)  # nothing appeared there since the start
        digest = _digest(written)
        move_into_place(written, dest)
        self.owned[dest.name] = digest
        partial = written.parent / MANIFEST  # in the scratch directory, then renamed into place
        partial.write_text(
            json.dumps({"files": self.owned}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        move_into_place(partial, self.manifest)
        return dest


# --- from a local directory -----------------------------------------------------------------------------


def copy_from(corpus: str, source: Path, out: Path, link: bool = False) -> list[Path]:
    """Copy (or symlink) a corpus from `source/{corpus}`; a plain `{split}.{lang}` file is gzipped on the way."""
    missing = []
    plan = []
    for dest in targets(corpus, out):
        gz, plain = source / corpus / dest.name, source / corpus / dest.name.removesuffix(".gz")
        if not gz.is_file() and not plain.is_file():
            missing.append(str(gz))
            continue
        origin = gz if gz.is_file() else plain
        if dest.exists() and origin.resolve() == dest.resolve():
            raise DataError(
                f"{origin} would be copied onto itself: --from_dir and --output name the same place; "
                "choose another --output"
            )
        plan.append((origin, dest))
    if missing:
        raise DataError(f"{source} lacks {len(missing)} file(s) of {corpus}: {', '.join(missing)}")
    folder = Folder(corpus, out)
    written = []
    with folder.scratch() as work:
        for origin, dest in plan:
            tmp = work / dest.name
            if origin.suffix == ".gz" and link:
                tmp.symlink_to(origin.resolve())
            elif origin.suffix == ".gz":
                shutil.copyfile(origin, tmp)
            else:
                with open(origin, "rb") as f, gzip.open(tmp, "wb") as g:
                    shutil.copyfileobj(f, g)
            written.append(folder.install(tmp, dest))
    return written


# --- from the network -----------------------------------------------------------------------------------


def fetch(url: str, dest: Path, timeout: float = 60) -> Path:
    """Download `url` to `dest`, a path in a scratch directory (a broken download leaves nothing behind)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as f:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, desc=dest.name, disable=None) as bar:
                while block := response.read(1 << 20):
                    f.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError) as e:
        dest.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise DataError(f"cannot download {url} ({reason}); {OFFLINE_HINT}") from None
    return dest


def _gzip_lines(lines: Sequence[str] | Path, dest: Path) -> None:
    with gzip.open(dest, "wb") as g:
        if isinstance(lines, Path):
            with open(lines, "rb") as f:
                shutil.copyfileobj(f, g)
        else:
            g.write("".join(f"{line}\n" for line in lines).encode("utf-8"))


def download(corpus: str, out: Path) -> list[Path]:
    """Fetch every split of `corpus` from its original source into `out/{corpus}`."""
    folder = Folder(corpus, out)
    written = []
    with folder.scratch() as work:
        for split, source in CORPORA[corpus].items():
            if source.sacrebleu:
                files = _from_sacrebleu(source.sacrebleu, split, work)
            elif source.members:
                archive = fetch(source.url, work / source.url.rsplit("/", 1)[1])
                files = []
                with tarfile.open(archive) as tar:
                    for lang in LANGS:
                        member = tar.extractfile(source.members[0].format(lang=lang))
                        if member is None:
                            raise DataError(f"{source.url} has no file {source.members[0].format(lang=lang)}")
                        with member, gzip.open(work / f"{split}.{lang}.gz", "wb") as g:
                            shutil.copyfileobj(member, g)
                        files.append(work / f"{split}.{lang}.gz")
                archive.unlink()
            else:
                files = [fetch(source.url.format(lang=lang), work / f"{split}.{lang}.gz") for lang in LANGS]
            written += [folder.install(f, folder.path / f.name) for f in files]
    return written


def _from_sacrebleu(test_set: str, split: str, folder: Path) -> list[Path]:
    from sacrebleu.utils import get_reference_files, get_source_file

    try:  # sacreBLEU exits the process when a download fails
        src, (ref,) = get_source_file(test_set, "en-de"), get_reference_files(test_set, "en-de")
    except (Exception, SystemExit) as e:
        raise DataError(f"sacreBLEU could not fetch {test_set} en-de ({e}); {OFFLINE_HINT}") from None
    for lang, path in zip(LANGS, (src, ref), strict=True):
        _gzip_lines(Path(path), folder / f"{split}.{lang}.gz")
    return [folder / f"{split}.{lang}.gz" for lang in LANGS]
