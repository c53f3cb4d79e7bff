"""The plugin manager: the built-ins load through the same hook as third-party plugins, in a fixed order, and
every registered component says which plugin and distribution it came from."""

from __future__ import annotations

import types

import pytest

from attnx import hookimpl
from attnx.model import build_transformer
from attnx.plugins import DEFAULT_PLUGINS, collect, plugin_manager, registry
from attnx.registry import DuplicateComponentError, Kind
from tests.conftest import tiny_config
from tests.test_registry import Swish, throwaway_plugin


def test_builtins_register_through_the_hook():
    pm = plugin_manager(entry_points=False)
    assert [name for name, _ in pm.list_name_plugin()] == list(DEFAULT_PLUGINS)
    reg = collect(pm)
    assert reg.entry("attention", "multihead").plugin == "attnx.components.attention"


def test_a_registered_plugin_is_usable_by_name():
    pm = plugin_manager(entry_points=False)
    plugin = throwaway_plugin("swish_plugin", "add_feedforward", Swish)
    pm.register(plugin)
    try:
        reg = collect(pm)
        config = tiny_config()
        config.feedforward.name = "swish"
        model = build_transformer(config, reg)
        assert isinstance(model.encoder_layers[0].ffn, Swish)
    finally:
        pm.unregister(plugin)


def test_every_component_says_where_it_came_from():
    pm = plugin_manager(entry_points=False)
    plugin = throwaway_plugin("swish_plugin", "add_feedforward", Swish)
    pm.register(plugin, name="swish_plugin")
    try:
        reg = collect(pm)
    finally:
        pm.unregister(plugin)
    builtin, added = reg.entry(Kind.FEEDFORWARD, "relu"), reg.entry(Kind.FEEDFORWARD, "swish")
    assert (builtin.plugin, builtin.distribution) == ("attnx.components.feedforward", "attnx (built-in)")
    assert (added.plugin, added.distribution) == ("swish_plugin", "registered in-process")
    assert (reg.plugin, reg.distribution) == (
        "<direct>",
        "<direct>",
    )  # what a direct reg.add() is credited to


def test_the_built_ins_register_first_so_a_clash_is_reported_against_them():
    """A plugin pluggy would call first (`tryfirst`) still registers after the built-ins."""
    pm = plugin_manager(entry_points=False)
    eager = types.ModuleType("eager_plugin")

    @hookimpl(tryfirst=True)
    def attnx_register_components(registry):
        registry.add_feedforward("relu", Swish)

    eager.attnx_register_components = attnx_register_components
    pm.register(eager, name="eager_plugin")
    try:
        with pytest.raises(DuplicateComponentError) as err:
            collect(pm)
    finally:
        pm.unregister(eager)
    assert str(err.value) == (
        "feedforward component 'relu' is registered twice: by plugin 'attnx.components.feedforward' "
        "(distribution attnx (built-in)) and by plugin 'eager_plugin' (distribution registered in-process). "
        "Uninstall one of them or rename the component."
    )


def test_the_process_wide_registry_is_built_once_with_the_installed_plugins():
    assert registry() is registry()
    assert {"multihead", "relu", "sinusoidal", "learned", "layernorm"} <= {
        e.name for e in registry().entries()
    }
