"""Every hook a plugin can implement. Each spec is an empty function whose docstring is the contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from attnx.registry import ComponentRegistry

hookspec = pluggy.HookspecMarker("attnx")
hookimpl = pluggy.HookimplMarker("attnx")
"""Marker for plugin hook implementations: `@hookimpl def attnx_register_components(registry): ...`.

Plugins import it as `from attnx import hookimpl`; the built-ins import it from here, so that nothing in
the library imports the top-level package (which offers `load` and so sits above every layer)."""


@hookspec
def attnx_register_components(registry: ComponentRegistry) -> None:
    """Register model components and training losses with `registry`.

    Call `registry.add_attention(name, cls)`, `registry.add_feedforward(name, cls)`,
    `registry.add_positional(name, cls)`, `registry.add_norm(name, cls)` or `registry.add_loss(name, cls)`
    once per component.
    A name must be unique within its kind across every installed plugin; a clash is an error naming both
    plugins. The class is constructed with the model's shape arguments (see `attnx.components.protocols`;
    a positional component's depend on where its `acts_on` says it acts) plus the `args` mapping given for it
    in the config; a loss is built with the label smoothing ε and its
    `args`, and called as `loss(model, batch)` returning `attnx.components.loss.LossSums`.
    """
