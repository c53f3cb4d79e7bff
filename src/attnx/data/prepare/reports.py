"""What prepare says it did: the summary `attnx prepare` prints and the `--report` file of what cleaning dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnx.data.errors import DataError
from attnx.data.prepare.settings import TRAIN


def _reasons(settings: dict[str, Any]) -> dict[str, str]:
    return {
        "blank": "with a blank side",
        "copy": "with the target a copy of the source",
        "duplicate": "duplicating an earlier pair",
        "language": "in another language",
        "too_long": f"over {settings['max_sentence_tokens']} tokens",
        "ratio": f"over length ratio {settings['max_ratio']}",
        "empty": "that encode to no token",
    }


def _dropped(dropped: dict[str, int], read: int, reasons: dict[str, str]) -> str:
    parts = [f"{n:,} {reasons.get(k, k)}" for k, n in dropped.items() if n]
    return f"dropped {sum(dropped.values()):,} of {read:,}: " + ", ".join(parts) if parts else "dropped none"


def report(meta: dict[str, Any]) -> str:
    """What `attnx prepare` prints: the corpus, each split, and for training what each corpus lost and why."""
    lines = [
        f"{'reused' if meta.get('reused') else 'prepared'} {meta['src_lang']}-{meta['tgt_lang']} corpus, "
        f"vocabulary {meta['vocab_size']} ({meta['dtype']} ids)"
    ]
    reasons = _reasons(meta["settings"])
    for name, s in meta["splits"].items():
        line = f"  {name}: {s['pairs']:,} pairs, {s['src_tokens']:,} + {s['tgt_tokens']:,} tokens"
        if s["dropped"]:
            line += "; " + _dropped(s["dropped"], s["read"], reasons)
        lines.append(line)
        corpora = s.get("corpora") or {}
        if len(corpora) > 1:
            for corpus, c in corpora.items():
                used = f" (used {c['repeat']} times)" if c.get("repeat", 1) != 1 else ""
                used += f", sources tagged {c['tag']}" if c.get("tag") else ""
                lines.append(
                    f"    {corpus}: {c['pairs']:,} pairs{used}; " + _dropped(c["dropped"], c["read"], reasons)
                )
        aligned = s.get("alignments") or {}
        if aligned:
            lines.append(
                f"    alignments: {aligned['links']:,} piece links, {aligned['pairs_with_links']:,} pairs with links"
            )
        if s.get("language_id") not in (None, "", "on"):
            lines.append(f"    language identification {s['language_id']}")
    return "\n".join(lines)


REPORT_HEADER = "# attnx prepare: what cleaning dropped"


def report_markdown(meta: dict[str, Any], output: str | Path) -> str:
    """The `--report` file: per training corpus and reason, how many pairs were dropped, with examples."""
    reasons = _reasons(meta["settings"])
    train = meta["splits"][TRAIN]
    out = [REPORT_HEADER, "", f"Corpus `{output}`, {meta['src_lang']}-{meta['tgt_lang']}.", ""]
    out += [f"Language identification: {train.get('language_id', 'on')}.", ""]
    out += ["| corpus | read | kept | " + " | ".join(reasons) + " |"]
    out += ["|---|---:|---:|" + "---:|" * len(reasons)]
    for corpus, c in train.get("corpora", {}).items():
        counts = " | ".join(f"{c['dropped'].get(k, 0):,}" for k in reasons)
        out.append(f"| {corpus} | {c['read']:,} | {c['pairs']:,} | {counts} |")
    for corpus, c in train.get("corpora", {}).items():
        for reason, examples in c.get("examples", {}).items():
            out += ["", f"## {corpus}: {c['dropped'].get(reason, 0):,} {reasons.get(reason, reason)}", ""]
            for e in examples:
                found = f" (identified as {e['found']})" if "found" in e else ""
                out.append(f"- line {e['line']}{found}: `{e['src']}` → `{e['tgt']}`")
    return "\n".join(out) + "\n"


def is_report(path: Path) -> bool:
    """Whether `path` is a `--report` file attnx prepare wrote (a regular file that starts with its header)."""
    if not path.is_file() or path.is_symlink():
        return False
    try:
        with open(path, "rb") as f:
            return f.readline().rstrip(b"\n") == REPORT_HEADER.encode()
    except OSError:
        return False


def write_report(path: Path, meta: dict[str, Any], output: str | Path) -> None:
    """Write the `--report` file; a file of that name is replaced only if an earlier report wrote it."""
    if path.exists() and not is_report(path):
        raise DataError(
            f"--report {path} exists and is not a report attnx wrote; pass a new file name (the corpus in "
            f"{output} is ready)"
        )
    try:
        path.write_text(report_markdown(meta, output), encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot write --report {path}: {e.strerror or e}") from e
