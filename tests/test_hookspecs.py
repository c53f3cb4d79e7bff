"""The hook specifications: one `attnx_` hook whose argument a plugin must name as specified, and the
`hookimpl` marker the built-ins and third parties share."""

from __future__ import annotations

import inspect
import types

import pluggy
import pytest

import attnx
from attnx import hookspecs
from attnx.plugins import plugin_manager


def test_every_hook_is_an_attnx_spec_with_a_contract():
    hooks = {
        name: f for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("attnx_")
    }
    assert set(hooks) == {"attnx_register_components"}
    for name, spec in hooks.items():
        assert spec.__doc__ and len(spec.__doc__.split()) > 20, f"{name}: the docstring is the contract"
        assert list(inspect.signature(spec).parameters) == ["registry"]
    pm = plugin_manager(entry_points=False)
    assert {name for name in hooks} <= {name for name in dir(pm.hook) if name.startswith("attnx_")}


def test_the_public_marker_is_the_one_the_built_ins_use():
    assert attnx.hookimpl is hookspecs.hookimpl
    assert hookspecs.hookimpl.project_name == hookspecs.hookspec.project_name == "attnx"


def test_an_implementation_naming_an_argument_the_spec_does_not_have_is_refused_when_registered():
    plugin = types.ModuleType("misspelt_plugin")

    @attnx.hookimpl
    def attnx_register_components(registy):  # misspelt: pluggy checks it against the spec
        raise AssertionError("never called")

    plugin.attnx_register_components = attnx_register_components
    pm = plugin_manager(entry_points=False)
    with pytest.raises(pluggy.PluginValidationError, match="registy"):
        pm.register(plugin)
