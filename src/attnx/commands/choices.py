"""`attnx choices`: what `auto` measured on this machine and keeps, and how to measure it again."""

from __future__ import annotations

import json


def choices(clear: bool = False) -> int:
    """List the measurements `auto` keeps on this machine (bf16 against fp32 for training and decoding,
    CTranslate2's compute types), so that the same command trains and decodes in the same precision each time.

    Args:
        clear: Forget them all: the next command that needs one measures it again (on a quiet machine).
    """
    from attnx.choices import choices_path, clear_choices, kept_choices

    path = choices_path()
    if path is None:
        print("keeping is off (ATTNX_CHOICES=off): every command measures what `auto` needs again")
        return 0
    if clear:
        print(f"cleared {clear_choices(path)} kept measurement(s) from {path}")
        return 0
    kept = kept_choices(path)
    print(f"{len(kept)} kept measurement(s) in {path} (attnx choices --clear forgets them)")
    for key, entry in sorted(kept.items(), key=lambda item: str(item[1].get("measured", ""))):
        value = (
            json.dumps(entry["value"]) if not isinstance(entry["value"], float) else f"{entry['value']:.2f}"
        )
        print(f"  {entry.get('measured', '?')}  {entry.get('what', key)}: {value}")
    return 0
