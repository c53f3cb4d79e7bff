"""A typed registry of model components, filled by plugins through `attnx_register_components`."""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from attnx.errors import AttnxError, ConfigError, UsageError


class Kind(StrEnum):
    """The four kinds of component a Transformer is assembled from, and the training loss."""

    ATTENTION = "attention"
    FEEDFORWARD = "feedforward"
    POSITIONAL = "positional"
    NORM = "norm"
    LOSS = "loss"


class UnknownComponentError(UsageError, LookupError):
    """A config names a component that no installed plugin registered."""


class ComponentArgumentError(UsageError, TypeError):
    """A config gives a component an argument its constructor does not take, leaves out one it needs, or
    gives one a value of the wrong type."""


class ComponentValueError(UsageError, ValueError):
    """A component refused the value of one of its arguments with a plain `ValueError` (a component that raises
    [ConfigError][attnx.errors.ConfigError] says so in its own words)."""


class DuplicateComponentError(UsageError, ValueError):
    """Two plugins registered the same name for the same kind."""


@dataclass(frozen=True)
class Entry:
    """One registered component: its class and the plugin (and distribution) it came from."""

    kind: Kind
    name: str
    factory: type
    plugin: str
    distribution: str


class ComponentRegistry:
    """Components by kind and name.

    Plugins receive an instance in `attnx_register_components` and call the `add_*` methods; the model
    builder calls [`get`][attnx.registry.ComponentRegistry.get]. `plugin` and `distribution` are set by
    the plugin manager while it calls each plugin, so errors and `attnx plugins` can say where a component
    came from.
    """

    def __init__(self) -> None:
        self._entries: dict[Kind, dict[str, Entry]] = {kind: {} for kind in Kind}
        self.plugin = "<direct>"
        self.distribution = "<direct>"

    def add(self, kind: Kind | str, name: str, factory: type) -> None:
        kind = Kind(kind)
        if not name or not isinstance(name, str):
            raise ConfigError(
                f"{self.plugin}: a {kind} component needs a non-empty string name, got {name!r}"
            )
        known = self._entries[kind]
        if name in known:
            first = known[name]
            raise DuplicateComponentError(
                f"{kind} component {name!r} is registered twice: by plugin {first.plugin!r} "
                f"(distribution {first.distribution}) and by plugin {self.plugin!r} "
                f"(distribution {self.distribution}). Uninstall one of them or rename the component."
            )
        known[name] = Entry(kind, name, factory, self.plugin, self.distribution)

    def add_attention(self, name: str, factory: type) -> None:
        self.add(Kind.ATTENTION, name, factory)

    def add_feedforward(self, name: str, factory: type) -> None:
        self.add(Kind.FEEDFORWARD, name, factory)

    def add_positional(self, name: str, factory: type) -> None:
        self.add(Kind.POSITIONAL, name, factory)

    def add_norm(self, name: str, factory: type) -> None:
        self.add(Kind.NORM, name, factory)

    def add_loss(self, name: str, factory: type) -> None:
        self.add(Kind.LOSS, name, factory)

    def entry(self, kind: Kind | str, name: str) -> Entry:
        kind = Kind(kind)
        try:
            return self._entries[kind][name]
        except KeyError:
            known = ", ".join(sorted(self._entries[kind])) or "(none)"
            raise UnknownComponentError(
                f"unknown {kind} component {name!r}; known {kind} components: {known}. "
                "Install the plugin that provides it, or check the spelling (`attnx plugins` lists them)."
            ) from None

    def get(self, kind: Kind | str, name: str) -> type:
        """The class (or factory) registered as `name` of `kind`; an unknown name lists the known ones."""
        return self.entry(kind, name).factory

    def arguments(
        self, kind: Kind | str, name: str, passed: int
    ) -> tuple[list[str], list[inspect.Parameter], bool] | None:
        """What a config sets of component `name`'s constructor when the model passes it `passed` positional
        arguments first: their names, the parameters a config's `args` may set (in the constructor's order,
        with their defaults and annotations), and whether it takes any keyword (`**kwargs`); None where the
        constructor has no signature to read."""
        try:
            params = list(inspect.signature(self.entry(kind, name).factory).parameters.values())
        except (TypeError, ValueError):
            return None
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        from_model = [p.name for p in positional[:passed]]
        settable = [
            p
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in from_model
        ]
        return from_model, settable, any(p.kind is p.VAR_KEYWORD for p in params)

    def check_arguments(
        self, kind: Kind | str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Raise [ComponentArgumentError][attnx.registry.ComponentArgumentError] naming the component, the bad
        key and the accepted ones when `kwargs` (a config's `args`) do not fit the constructor's signature,
        after the positional shape arguments `args` the model passes."""
        entry = self.entry(kind, name)
        found = self.arguments(kind, name, len(args))
        if found is None:  # no introspectable signature: the call itself reports
            return
        from_model, settable, any_keyword = found
        accepted = [p.name for p in settable]
        where = f"{entry.kind} component {name!r} ({entry.factory.__qualname__}, from {entry.distribution})"
        takes = f"accepted args: {', '.join(accepted)}" if accepted else "it accepts no args"
        for key in kwargs:
            if key in from_model:
                raise ComponentArgumentError(
                    f"{where}: {key!r} is passed by the model (as are {', '.join(from_model)}), not through "
                    f"args; {takes}"
                )
            if key not in accepted and not any_keyword:
                close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ComponentArgumentError(f"{where} has no argument {key!r}{hint}; {takes}")
        try:
            inspect.signature(entry.factory).bind(*args, **kwargs)
        except TypeError as err:
            raise ComponentArgumentError(f"{where}: {err}; {takes}") from None

    def build(self, kind: Kind | str, name: str, *args: Any, **kwargs: Any) -> Any:
        """Instantiate component `name` of `kind`; arguments that do not fit its signature are refused
        before it is called, naming the component, the bad key and the accepted ones; a value its constructor
        refuses (a `TypeError` or `ValueError` of its own) is one line naming the component too."""
        factory = self.get(kind, name)
        self.check_arguments(kind, name, args, kwargs)
        try:
            return factory(*args, **kwargs)
        except TypeError as err:  # most often a value of the wrong type in args; --debug shows where
            entry = self.entry(kind, name)
            raise ComponentArgumentError(
                f"cannot build {entry.kind} component {name!r} ({entry.factory.__qualname__}, from "
                f"{entry.distribution}): {err}; check the types of its args"
            ) from err
        except ValueError as err:
            if isinstance(err, AttnxError):  # already one line in the component's words
                raise
            entry = self.entry(kind, name)
            raise ComponentValueError(
                f"cannot build {entry.kind} component {name!r} ({entry.factory.__qualname__}, from "
                f"{entry.distribution}): {err}; check the values of its args"
            ) from err

    def names(self, kind: Kind | str) -> list[str]:
        return sorted(self._entries[Kind(kind)])

    def entries(self) -> list[Entry]:
        return [entry for kind in Kind for _, entry in sorted(self._entries[kind].items())]
