"""What every benchmark prints beside its numbers: the machine it ran on (figures from different machines
never compare). Imported by the scripts beside it (``python bench/NAME.py`` puts ``bench/`` on the path)."""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """``Model name`` of ``lscpu``, else of ``/proc/cpuinfo``, else what ``platform`` knows."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        if m := re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE):
            return m.group(1).strip()
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
