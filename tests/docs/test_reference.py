"""The plugin guide names every hook and every registered component, so a new one cannot go undocumented."""

from __future__ import annotations

import inspect
import re

from attnx import hookspecs
from attnx.plugins import registry
from tests.conftest import REPO

PLUGIN_GUIDE = REPO / "docs" / "plugins.md"


def prose(path) -> str:
    """The page without its mkdocstrings directives: what a reader sees written, not generated."""
    return re.sub(r"^::: .*(\n {4}.*)*", "", path.read_text(encoding="utf-8"), flags=re.M)


def components_table(text: str) -> set[tuple[str, str]]:
    """``(kind, name)`` of every row of the "Registered components" table."""
    section = text.split("## Registered components", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| (\w+) \| `([^`]+)` \|", section, flags=re.M))


def test_every_hook_is_described_in_the_plugin_guide():
    hooks = [
        name for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("attnx_")
    ]
    assert hooks, "attnx.hookspecs defines no hook"
    text = prose(PLUGIN_GUIDE)
    missing = [hook for hook in hooks if hook not in text]
    assert not missing, f"hooks not described in {PLUGIN_GUIDE.relative_to(REPO)}: {missing}"
    assert "::: attnx.hookspecs" in PLUGIN_GUIDE.read_text(encoding="utf-8"), "the hook reference is gone"


def test_every_registered_component_is_in_the_table_and_nothing_else():
    registered = {(str(entry.kind), entry.name) for entry in registry().entries()}
    documented = components_table(PLUGIN_GUIDE.read_text(encoding="utf-8"))
    assert registered - documented == set(), "registered but missing from the Registered components table"
    assert documented - registered == set(), "in the Registered components table but not registered"
