"""attnx: the Transformer of *Attention Is All You Need* as a config-first translation framework.

The Python API:

```python
import attnx

translator = attnx.load("averaged.ckpt")  # a checkpoint, or a directory from `attnx export`
translator.translate(["A dog runs.", "Two men are talking."])
```

Importing `attnx` is cheap: torch is imported on first use of `load`, `Translator` or `SearchConfig`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from attnx.hookspecs import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "load": "attnx.inference.load",
    "Translator": "attnx.inference.translator",
    "SearchConfig": "attnx.inference.config",
}

__all__ = ["SearchConfig", "Translator", "__version__", "hookimpl", "load"]

if TYPE_CHECKING:
    from attnx.inference.config import SearchConfig
    from attnx.inference.load import load
    from attnx.inference.translator import Translator


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnx' has no attribute {name!r}")
