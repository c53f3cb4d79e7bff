"""The plugin system: one hook for built-ins and third parties, clear errors."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
from torch import nn

from attnx import hookimpl
from attnx.model import build_transformer
from attnx.plugins import collect, plugin_manager
from attnx.registry import (
    ComponentArgumentError,
    ComponentRegistry,
    ComponentValueError,
    DuplicateComponentError,
    UnknownComponentError,
)
from tests.conftest import tiny_config


class Swish(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        h = self.w1(x)
        return self.w2(h * h.sigmoid())


def throwaway_plugin(name: str, kind_method: str, cls: type):
    module = types.ModuleType(name)

    @hookimpl
    def attnx_register_components(registry):
        getattr(registry, kind_method)("mish", cls)  # a name no built-in has

    module.attnx_register_components = attnx_register_components
    return module


def test_unknown_name_lists_the_known_ones():
    config = tiny_config()
    config.self_attention.name = "linformer"
    with pytest.raises(UnknownComponentError, match=r"unknown attention component 'linformer'.*multihead"):
        build_transformer(config)


def test_duplicate_registration_names_both_plugins():
    pm = plugin_manager(entry_points=False)
    first = throwaway_plugin("first_plugin", "add_feedforward", Swish)
    second = throwaway_plugin("second_plugin", "add_feedforward", Swish)
    pm.register(first, name="first_plugin")
    pm.register(second, name="second_plugin")
    try:
        with pytest.raises(DuplicateComponentError, match=r"'first_plugin'.*'second_plugin'"):
            collect(pm)
    finally:
        pm.unregister(first)
        pm.unregister(second)


def test_bad_component_arguments_name_the_component_the_key_and_the_accepted_ones():
    config = tiny_config()
    config.feedforward.args = {"dropuot": 0.1}
    with pytest.raises(ComponentArgumentError) as err:
        build_transformer(config)
    assert str(err.value) == (
        "feedforward component 'relu' (ReluFeedForward, from attnx (built-in)) has no argument 'dropuot' "
        "(did you mean 'dropout'?); accepted args: dropout"
    )


def test_component_arguments_the_model_passes_are_refused_in_args():
    config = tiny_config()
    config.self_attention.args = {"n_heads": 2}
    with pytest.raises(
        ComponentArgumentError, match=r"'n_heads' is passed by the model.*accepted args: dropout"
    ):
        build_transformer(config)


def test_an_argument_of_the_wrong_type_names_the_component():
    class Windowed(Swish):
        def __init__(self, d_model: int, d_ff: int, window: int = 2) -> None:
            super().__init__(d_model, d_ff)
            if window < 0:  # a YAML string here: TypeError inside the constructor
                raise ValueError("window must be >= 0")

    reg = ComponentRegistry()
    reg.add_feedforward("windowed", Windowed)
    with pytest.raises(ComponentArgumentError, match=r"cannot build feedforward component 'windowed'.*types"):
        reg.build("feedforward", "windowed", 8, 16, window="2")


def test_a_value_a_plugin_s_constructor_refuses_is_one_line_naming_the_component():
    """A plain ValueError of a plugin's constructor was a traceback; a ConfigError stays the plugin's own line."""
    from attnx.errors import ConfigError

    class Windowed(Swish):
        def __init__(self, d_model: int, d_ff: int, window: int = 2, strict: bool = False) -> None:
            super().__init__(d_model, d_ff)
            if window < 0:
                raise (ConfigError if strict else ValueError)(f"window must be >= 0, got {window}")

    reg = ComponentRegistry()
    reg.add_feedforward("windowed", Windowed)
    with pytest.raises(ComponentValueError) as err:
        reg.build("feedforward", "windowed", 8, 16, window=-1)
    assert str(err.value) == (
        "cannot build feedforward component 'windowed' (test_a_value_a_plugin_s_constructor_refuses_is_one_line_"
        "naming_the_component.<locals>.Windowed, from <direct>): window must be >= 0, got -1; check the values "
        "of its args"
    )
    assert isinstance(err.value, ValueError) and err.value.exit_code == 2
    with pytest.raises(ConfigError) as own:
        reg.build("feedforward", "windowed", 8, 16, window=-1, strict=True)
    assert type(own.value) is ConfigError and str(own.value) == "window must be >= 0, got -1"


def test_a_constructor_taking_any_keyword_accepts_every_argument_but_a_missing_one_is_named():
    class Anything(Swish):
        def __init__(self, d_model: int, d_ff: int, *, gate: str, **options) -> None:
            super().__init__(d_model, d_ff)
            self.options = options

    reg = ComponentRegistry()
    reg.add_feedforward("anything", Anything)
    assert reg.build("feedforward", "anything", 8, 16, gate="x", whatever=1).options == {"whatever": 1}
    with pytest.raises(ComponentArgumentError, match=r"'anything'.*missing a required argument: 'gate'"):
        reg.build("feedforward", "anything", 8, 16)


def test_registry_rejects_unknown_kind():
    with pytest.raises(ValueError):
        ComponentRegistry().add("optimizer", "adam", object)


def test_plugins_command_lists_builtins_by_kind():
    out = subprocess.run(
        [sys.executable, "-m", "attnx", "plugins"], capture_output=True, text=True, check=True
    ).stdout
    for line in ("attention:", "multihead", "feedforward:", "relu", "positional:", "sinusoidal", "learned"):
        assert line in out
    assert "norm:" in out and "layernorm" in out and "attnx (built-in)" in out


def test_describe_reports_the_papers_parameter_counts():
    out = subprocess.run(
        [sys.executable, "-m", "attnx", "describe", "--preset", "base"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "parameters: 63,082,496 (63.1M)" in out and "MFLOP" in out


def test_the_arguments_a_config_sets_are_those_after_what_the_model_passes():
    """The same split the check of a config's args makes: the first shape arguments are the model's."""

    class Gated(nn.Module):
        def __init__(self, d_model: int, d_ff: int, /, dropout: float = 0.0, *, bias: bool = False, **rest):
            super().__init__()

    reg = ComponentRegistry()
    reg.add_feedforward("gated", Gated)
    reg.add_feedforward("mish", Swish)
    from_model, settable, any_keyword = reg.arguments("feedforward", "gated", 2)
    assert from_model == ["d_model", "d_ff"] and any_keyword
    assert [(p.name, p.default) for p in settable] == [("dropout", 0.0), ("bias", False)]
    assert reg.arguments("feedforward", "mish", 2) == (["d_model", "d_ff"], [], False)
    with pytest.raises(ComponentArgumentError, match=r"has no argument 'dropout'; it accepts no args$"):
        reg.check_arguments("feedforward", "mish", (8, 16), {"dropout": 0.1})
    reg.check_arguments("feedforward", "gated", (8, 16), {"dropout": 0.1, "anything": 1})  # **rest takes it
