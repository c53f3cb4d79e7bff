"""The plugin manager: built-in components load through the same hook as third-party ones.

Built-ins come from [`DEFAULT_PLUGINS`][attnx.plugins.DEFAULT_PLUGINS]; third-party distributions are found
through the `attnx` entry-point group (`[project.entry-points.attnx]` in their `pyproject.toml`).
"""

from __future__ import annotations

import functools
from types import ModuleType

import pluggy

from attnx import hookspecs
from attnx.components import (
    alignment_loss,
    attention,
    feedforward,
    gated,
    loss,
    norm,
    positional,
    relative,
    rotary,
)
from attnx.registry import ComponentRegistry

_BUILT_INS: tuple[ModuleType, ...] = (
    attention,
    feedforward,
    gated,
    positional,
    rotary,
    relative,
    norm,
    loss,
    alignment_loss,
)

DEFAULT_PLUGINS: tuple[str, ...] = tuple(module.__name__ for module in _BUILT_INS)
"""The modules that register the built-in components (the paper's and today's), loaded before any entry
point (in this order)."""

ENTRY_POINT_GROUP = "attnx"


def plugin_manager(*, entry_points: bool = True) -> pluggy.PluginManager:
    """A fresh plugin manager with the built-ins and (by default) every installed entry point."""
    pm = pluggy.PluginManager("attnx")
    pm.add_hookspecs(hookspecs)
    for module in _BUILT_INS:
        pm.register(module, name=module.__name__)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


def _distribution_of(pm: pluggy.PluginManager, plugin: object) -> str:
    for loaded, dist in pm.list_plugin_distinfo():
        if loaded is plugin:
            return f"{dist.project_name} {dist.version}"
    if getattr(plugin, "__name__", "") in DEFAULT_PLUGINS:
        return "attnx (built-in)"
    return "registered in-process"


def collect(pm: pluggy.PluginManager) -> ComponentRegistry:
    """Ask every registered plugin to fill one registry, tracking who registered what."""
    registry = ComponentRegistry()
    order = {plugin_name: i for i, (plugin_name, _) in enumerate(pm.list_name_plugin())}
    impls = sorted(
        pm.hook.attnx_register_components.get_hookimpls(), key=lambda impl: order[impl.plugin_name]
    )
    for impl in impls:  # registration order: built-ins first, so a clash is reported against them
        registry.plugin = impl.plugin_name
        registry.distribution = _distribution_of(pm, impl.plugin)
        impl.function(registry=registry)
    registry.plugin = registry.distribution = "<direct>"
    return registry


@functools.cache
def registry() -> ComponentRegistry:
    """The process-wide registry (built once). Tests that add plugins use [`collect`][attnx.plugins.collect]
    directly."""
    return collect(plugin_manager())
