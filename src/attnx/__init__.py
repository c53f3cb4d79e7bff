"""attnx: the Transformer of *Attention Is All You Need* as a config-first translation framework."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("attnx")
"""Marker for plugin hook implementations: ``@hookimpl def attnx_register_components(registry): ...``."""

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
