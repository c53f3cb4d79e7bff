"""What `attnx plugins` says of each component's arguments: those after what the model passes, their defaults
and docs, for built-ins and third-party plugins alike, and keys that `attnx fit` takes as they are printed."""

from __future__ import annotations

import re
from types import ModuleType

import pytest
import yaml

from attnx import hookimpl
from attnx.cli import main
from attnx.commands.component_args import PASSED, argument_doc, listing
from attnx.plugins import collect, plugin_manager, registry
from attnx.registry import ComponentRegistry, Kind
from tests.conftest import tiny_config


def test_each_kind_is_passed_as_many_arguments_as_the_model_gives_it(monkeypatch) -> None:
    """What the listing leaves out as "from the model" is what the builders and the training module pass."""
    from attnx.model import build_transformer
    from attnx.model.builders import ComponentSpec
    from attnx.training.module import TranslationTask

    passed: dict[Kind, set[int]] = {}
    build = ComponentRegistry.build

    def recorded(self, kind, name, *args, **kwargs):
        passed.setdefault(Kind(kind), set()).add(len(args))
        return build(self, kind, name, *args, **kwargs)

    monkeypatch.setattr(ComponentRegistry, "build", recorded)
    for positional in ("sinusoidal", "rotary", "t5_relative"):  # added to embeddings, on q/k, on the scores
        build_transformer(tiny_config(positional=ComponentSpec(positional)))
    TranslationTask(tiny_config(), loss=ComponentSpec("reference"))
    assert passed == {kind: {count} for kind, count in PASSED.items()}


def test_grouped_query_attention_s_kv_heads_is_listed_with_its_default_and_doc(capsys) -> None:
    assert main(["plugins", "--kind", "attention"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "attention: choose with --model.transformer.self_attention.name NAME, set an arg with "
        "--model.transformer.self_attention.args.ARG VALUE (cross_attention alike)"
    )
    start = out.index(next(line for line in out if line.startswith("  multihead ")))
    assert out[start + 1] == "      from the model: d_model, n_heads"
    kv_heads = next(line for line in out[start:] if line.strip().startswith("kv_heads"))
    assert kv_heads.split()[:5] == ["kv_heads:", "int", "|", "None", "="]
    assert kv_heads.endswith(
        "None  `kv_heads` (default `n_heads`): grouped-query attention (Ainslie et al. 2023)"
    )
    assert out[-1] == (
        "a config file nests the same keys: --model.transformer.self_attention.args.ARG VALUE is "
        "model: {transformer: {self_attention: {args: {ARG: VALUE}}}}"
    )
    assert not any(line.startswith(("feedforward:", "loss:")) for line in out)


def test_the_printed_keys_are_those_fit_takes(capsys) -> None:
    """Each kind's option spellings, as printed, with one argument of one of its components."""
    values = {
        Kind.ATTENTION: ("multihead", "kv_heads", "2"),
        Kind.FEEDFORWARD: ("swiglu", "bias", "true"),
        Kind.POSITIONAL: ("rotary", "base", "500.0"),
        Kind.NORM: ("rmsnorm", "eps", "1e-05"),
        Kind.LOSS: ("label_smoothed", "chunk_rows", "64"),
    }
    argv = []
    for kind, (name, arg, value) in values.items():
        header = listing(registry(), [kind])[0]
        choose, set_arg = re.findall(r"(--\S+\.name) NAME, set an arg with (--\S+\.args\.)ARG VALUE", header)[
            0
        ]
        argv += [choose, name, set_arg + arg, value]
    with pytest.raises(SystemExit) as printed:
        main(["fit", "--config", "tiny", *argv, "--print_config"])
    assert printed.value.code == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    transformer = model["transformer"]
    assert transformer["self_attention"] == {"name": "multihead", "args": {"kv_heads": 2}}
    assert transformer["feedforward"] == {"name": "swiglu", "args": {"bias": True}}
    assert transformer["positional"] == {"name": "rotary", "args": {"base": 500.0}}
    assert transformer["norm"] == {"name": "rmsnorm", "args": {"eps": 1e-05}}
    assert model["loss"] == {"name": "label_smoothed", "args": {"chunk_rows": 64}}


class Windowed:
    """A third party's attention. `stride` skips keys.

    Args:
        window: Keys each side a query sees. Beyond them, none.
        scale: Multiplies the scores ([`scale`][x.y.scale] of the paper).
    """

    def __init__(
        self, d_model: int, n_heads: int, window: int, scale: float = 1.0, stride=2, **extra
    ) -> None:
        pass


def test_a_third_party_component_s_arguments_are_listed_as_a_built_in_s() -> None:
    plugin = ModuleType("windowed_plugin")

    @hookimpl
    def attnx_register_components(registry) -> None:
        registry.add_attention("windowed", Windowed)

    plugin.attnx_register_components = attnx_register_components
    pm = plugin_manager(entry_points=False)
    pm.register(plugin, name="windowed_plugin")
    try:
        lines = listing(collect(pm), [Kind.ATTENTION])
    finally:
        pm.unregister(plugin)
    start = lines.index(next(line for line in lines if line.startswith("  windowed ")))
    assert f"{Windowed.__module__}.Windowed  [registered in-process]" in lines[start]
    assert [line.strip() for line in lines[start + 1 : start + 6]] == [
        "from the model: d_model, n_heads",
        "window: int (required)  Keys each side a query sees",
        "scale: float = 1.0      Multiplies the scores (`scale` of the paper)",
        "stride = 2              `stride` skips keys",
        "any other keyword (**kwargs)",
    ]


def test_an_argument_without_a_doc_has_none() -> None:
    from attnx.components.norm import LayerNorm

    assert argument_doc(LayerNorm, "eps") == ""
    assert argument_doc(Windowed, "window") == "Keys each side a query sees"


def test_the_plugin_guide_shows_what_attnx_plugins_prints() -> None:
    """docs/plugins.md's example: the attention header and the built-in `multihead` as they are listed now."""
    from tests.conftest import REPO

    guide = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    shown = guide.split("\n```text\nattention: ", 1)[1].split("\n```", 1)[0].splitlines()
    live = listing(registry(), [Kind.ATTENTION])
    live[0] = live[0].removeprefix("attention: ")
    builtin = [i for i, line in enumerate(live) if line.startswith("  multihead ")][0]
    block = live[builtin : next(i for i in range(builtin + 1, len(live)) if not live[i].startswith("      "))]
    assert shown[0] == live[0] and shown[1 : 1 + len(block)] == block and shown[-1] == live[-1]
