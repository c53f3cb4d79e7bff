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

import gzip
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from attnx.data.errors import DataError

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


# --- from a local directory -----------------------------------------------------------------------------


def copy_from(corpus: str, source: Path, out: Path, link: bool = False) -> list[Path]:
    """Copy (or symlink) a corpus from `source/{corpus}`; a plain `{split}.{lang}` file is gzipped on the way."""
    missing, written = [], []
    for dest in targets(corpus, out):
        gz, plain = source / corpus / dest.name, source / corpus / dest.name.removesuffix(".gz")
        if not gz.is_file() and not plain.is_file():
            missing.append(str(gz))
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        if gz.is_file() and link:
            dest.symlink_to(gz.resolve())
        elif gz.is_file():
            shutil.copyfile(gz, dest)
        else:
            with open(plain, "rb") as f, gzip.open(dest, "wb") as g:
                shutil.copyfileobj(f, g)
        written.append(dest)
    if missing:
        raise DataError(f"{source} lacks {len(missing)} file(s) of {corpus}: {', '.join(missing)}")
    return written


# --- from the network -----------------------------------------------------------------------------------


def fetch(url: str, dest: Path, timeout: float = 60) -> Path:
    """Download `url` to `dest` (through a temporary name, so a broken download leaves nothing behind)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as f:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, desc=dest.name, disable=None) as bar:
                while block := response.read(1 << 20):
                    f.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise DataError(f"cannot download {url} ({reason}); {OFFLINE_HINT}") from None
    partial.replace(dest)
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
    folder = out / corpus
    cache = folder / "downloads"
    written = []
    for split, source in CORPORA[corpus].items():
        if source.sacrebleu:
            written += _from_sacrebleu(source.sacrebleu, split, folder)
        elif source.members:
            archive = cache / source.url.rsplit("/", 1)[1]
            if not archive.is_file():
                fetch(source.url, archive)
            with tarfile.open(archive) as tar:
                for lang in LANGS:
                    member = tar.extractfile(source.members[0].format(lang=lang))
                    if member is None:
                        raise DataError(f"{archive} has no file {source.members[0].format(lang=lang)}")
                    with member, gzip.open(folder / f"{split}.{lang}.gz", "wb") as g:
                        shutil.copyfileobj(member, g)
                    written.append(folder / f"{split}.{lang}.gz")
        else:
            for lang in LANGS:
                written.append(fetch(source.url.format(lang=lang), folder / f"{split}.{lang}.gz"))
    shutil.rmtree(cache, ignore_errors=True)
    return written


def _from_sacrebleu(test_set: str, split: str, folder: Path) -> list[Path]:
    from sacrebleu.utils import get_reference_files, get_source_file

    folder.mkdir(parents=True, exist_ok=True)
    try:  # sacreBLEU exits the process when a download fails
        src, (ref,) = get_source_file(test_set, "en-de"), get_reference_files(test_set, "en-de")
    except (Exception, SystemExit) as e:
        raise DataError(f"sacreBLEU could not fetch {test_set} en-de ({e}); {OFFLINE_HINT}") from None
    for lang, path in zip(LANGS, (src, ref), strict=True):
        _gzip_lines(Path(path), folder / f"{split}.{lang}.gz")
    return [folder / f"{split}.{lang}.gz" for lang in LANGS]
