"""What `attnx plugins` says of each registered component: the arguments of its constructor a config sets
(those after the ones the model passes it), with their defaults and the first words of their doc, and the keys
that set them in a config and on the command line of `attnx fit`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from attnx.registry import ComponentRegistry, Entry, Kind

PASSED = {Kind.ATTENTION: 2, Kind.FEEDFORWARD: 2, Kind.POSITIONAL: 2, Kind.NORM: 1, Kind.LOSS: 1}
"""How many arguments the model passes a component of each kind, positionally, before a config's `args`:
d_model and n_heads to an attention, d_model and d_ff to a feed-forward network, a width (d_model, a head's d_k
or n_heads, by where it acts) and max_len to a positional encoding, d_model to a norm
([build_transformer][attnx.model.builders.build_transformer]), and `model.label_smoothing` to a loss
([TranslationTask][attnx.training.module.TranslationTask])."""


def settings_keys(kind: Kind) -> list[str]:
    """The config keys that choose a component of `kind` and hold its `args`: `model.transformer.SLOT` for each
    slot of that kind of the model ([SLOTS][attnx.model.builders.SLOTS]), `model.loss` for the loss."""
    from attnx.model.builders import SLOTS

    if kind is Kind.LOSS:
        return ["model.loss"]
    return [f"model.transformer.{slot}" for slot, slot_kind in SLOTS.items() if slot_kind is kind]


def how_to_set(kind: Kind) -> str:
    """The options of `attnx fit` that choose a component of `kind` and set one of its arguments."""
    first, *others = settings_keys(kind)
    alike = f" ({', '.join(key.rpartition('.')[2] for key in others)} alike)" if others else ""
    return f"choose with --{first}.name NAME, set an arg with --{first}.args.ARG VALUE{alike}"


def nested(kind: Kind) -> str:
    """The last line of `attnx plugins`: how a config file spells the options of a component of `kind`."""
    keys = [*settings_keys(kind)[0].split("."), "args"]
    mapping = "{ARG: VALUE}"
    for key in reversed(keys[1:]):
        mapping = f"{{{key}: {mapping}}}"
    return f"a config file nests the same keys: --{'.'.join(keys)}.ARG VALUE is {keys[0]}: {mapping}"


SENTENCE_END = re.compile(r"(?<!\bal\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<=[.!?])\s+(?=[A-Z0-9`\[(])")
"""Where a sentence of a docstring ends: not at `et al. 2023`, `e.g. 3` or `i.e. the`."""

CROSS_REFERENCE = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
"""A link of the API reference in a docstring, `[text][attnx.x.y]`: its text is what `--help` shows."""

LEADING_NAMES = re.compile(r"^`\w+`(?:\s*(?:/|,|and|or)\s*`\w+`)*")
"""The backticked names a clause opens with: `d_k` / `d_v` default to ..."""


def sentences(text: str) -> list[str]:
    """The sentences of `text`, its lines joined, with the text of its API reference links."""
    return SENTENCE_END.split(CROSS_REFERENCE.sub(r"\1", " ".join(text.split())))


def clauses(text: str) -> list[str]:
    """The sentences of `text`, each cut at the semicolons and commas outside brackets."""
    out = []
    for sentence in sentences(text):
        depth, start = 0, 0
        for i, char in enumerate(sentence):
            depth += (char in "([{") - (char in ")]}")
            if depth == 0 and sentence.startswith((", ", "; "), i):
                out.append(sentence[start:i])
                start = i + 2
        out.append(sentence[start:])
    return [clause.strip().rstrip(".") for clause in out if clause.strip()]


def argument_doc(factory: Any, name: str) -> str:
    """The first sentence of argument `name`'s doc in `factory`'s docstrings: its entry under `Args:` (of the
    class or of its `__init__`), else the clause of the class docstring that opens with it (`kv_heads`
    (default `n_heads`): grouped-query attention ...); empty where there is neither."""
    import docstring_parser

    for target in (factory, getattr(factory, "__init__", None)):
        try:
            parsed = docstring_parser.parse(inspect.getdoc(target) or "")
        except docstring_parser.ParseError:
            continue
        for param in parsed.params:
            if param.arg_name == name and param.description:
                return sentences(param.description)[0].rstrip(".")
    for clause in clauses((inspect.getdoc(factory) or "").split("\n\nArgs:")[0]):
        opening = LEADING_NAMES.match(clause)
        if opening and f"`{name}`" in opening.group(0):
            return clause
    return ""


def annotated(param: inspect.Parameter) -> str:
    """`dropout: float = 0.0`, `kv_heads: int | None = None`, `window: int (required)`."""
    kind = param.annotation
    text = param.name
    if kind is not param.empty:
        text += f": {kind if isinstance(kind, str) else inspect.formatannotation(kind)}"
    return text + (" (required)" if param.default is param.empty else f" = {param.default!r}")


def entry_lines(registry: ComponentRegistry, entry: Entry) -> list[str]:
    """`entry`'s line of `attnx plugins` and, below it, the arguments the model passes it and those a config
    sets, one a line."""
    lines = [
        f"  {entry.name:<16} {entry.factory.__module__}.{entry.factory.__qualname__}  [{entry.distribution}]"
    ]
    found = registry.arguments(entry.kind, entry.name, PASSED[entry.kind])
    if found is None:
        return [*lines, "      (its arguments cannot be read from its signature)"]
    from_model, settable, any_keyword = found
    if from_model:
        lines.append(f"      from the model: {', '.join(from_model)}")
    width = max((len(annotated(p)) for p in settable), default=0)
    for param in settable:
        doc = argument_doc(entry.factory, param.name)
        lines.append(f"      {annotated(param):<{width}}  {doc}".rstrip())
    if any_keyword:
        lines.append("      any other keyword (**kwargs)")
    if not settable and not any_keyword:
        lines.append("      no args")
    return lines


def listing(registry: ComponentRegistry, kinds: list[Kind]) -> list[str]:
    """`attnx plugins`: for each of `kinds`, how a config sets a component of it, then every registered one."""
    lines = []
    for kind in kinds:
        lines.append(f"{kind}: {how_to_set(kind)}")
        for entry in (e for e in registry.entries() if e.kind == kind):
            lines += entry_lines(registry, entry)
    return [*lines, nested(kinds[0])] if kinds else lines
