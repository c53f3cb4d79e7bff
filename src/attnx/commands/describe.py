"""`attnx describe`: a model's parameters, FLOPs and decoding cache, and with `--device` the memory and time of
its training run, from fit configs, a preset, and the options of `attnx fit` that change them.

The fit options it takes (`--model.transformer.*`, `--trainer.*`, `--data.*`, `--lora.*`) are spelt and typed
as `attnx fit` spells and types them: their groups are made from fit's own signatures
([options_of][attnx.commands.describe.options_of]), each option None until the command line gives it, so that
what it gives goes over the config files and nothing else does.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import Trainer

from attnx.data.datamodule import PLAN_OPTIONS, TranslationDataModule
from attnx.errors import ConfigError
from attnx.model import TransformerConfig
from attnx.training.lora import LowRankAdapters
from attnx.training.module import TranslationTask


def options_of(
    target: type | Any, title: str, keys: Iterable[str] | None = None, without: Iterable[str] = ()
) -> type:
    """A dataclass with a field for each parameter `keys` (default: all) of class `target`'s constructor, or
    each field of dataclass `target`: of the same type but optional, None by default (not given), with the
    same help. A field of a dataclass type is itself such options, so that each of its fields is an option
    of its own (`--model.transformer.d_model`), as it is in `attnx fit`; `without` names the dotted ones left
    out (`transformer.vocab_size`)."""
    import docstring_parser

    if dataclasses.is_dataclass(target):
        names, hints = [f.name for f in dataclasses.fields(target)], typing.get_type_hints(target)
        docs = docstring_parser.parse_from_object(target).params
    else:
        names = [p for p in inspect.signature(target.__init__).parameters if p != "self"]
        hints = typing.get_type_hints(target.__init__)
        docs = [*docstring_parser.parse_from_object(target).params]
        docs += docstring_parser.parse_from_object(target.__init__).params
    helps = {doc.arg_name: " ".join((doc.description or "").split()) for doc in docs}
    without = set(without)
    wanted = [name for name in names if (keys is None or name in set(keys)) and name not in without]
    fields: list[tuple[str, Any, Any]] = []
    for name in wanted:
        kind = hints[name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            inner = [key.removeprefix(f"{name}.") for key in without if key.startswith(f"{name}.")]
            group = options_of(kind, helps.get(name, name), without=inner)
            fields.append((name, group, dataclasses.field(default_factory=group)))
        else:
            fields.append((name, kind | None, dataclasses.field(default=None)))
    options = dataclasses.make_dataclass(f"{getattr(target, '__name__', 'Fit')}Options", fields)
    options.__module__ = __name__
    args = "".join(f"\n    {name}: {helps[name]}" for name in wanted if helps.get(name))
    options.__doc__ = f"{title}\n\nArgs:{args}" if args else title
    return options


TRAINER_KEYS = (
    "accelerator",
    "devices",
    "precision",
    "max_steps",
    "max_time",
    "accumulate_grad_batches",
    "val_check_interval",
)
"""The trainer settings the estimate reads (`attnx.commands.fit_sections`)."""

ModelOptions = options_of(
    TranslationTask,
    "--model.*: the model of `attnx fit`",
    ["transformer"],
    without=["transformer.vocab_size"],  # fit links it from the data: --vocab_size here
)
TrainerOptions = options_of(Trainer, "--trainer.*: the trainer of `attnx fit`", TRAINER_KEYS)
DataOptions = options_of(
    TranslationDataModule, "--data.*: the data of `attnx fit`", ("data_dir", *PLAN_OPTIONS)
)
LoraOptions = options_of(LowRankAdapters, "--lora.*: the adapters of `attnx fit`")


def given(options: Any) -> dict[str, Any]:
    """The options of `options` (of [options_of][attnx.commands.describe.options_of]) the command line gave, as
    the mapping a config file would hold; a number given where a string may stand too (`--trainer.devices 2`)
    is the number."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(type(options))
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if dataclasses.is_dataclass(value):
            value = given(value) or None
        elif isinstance(value, str) and value.isdigit() and int in typing.get_args(hints[field.name]):
            value = int(value)
        if value is not None:
            out[field.name] = value
    return out


def flat(values: dict[str, Any], prefix: str) -> list[str]:
    """`--prefix.key value` for each value of nested `values`, as the command line gave them."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += flat(value, f"{prefix}.{key}")
        else:
            out.append(f"--{prefix}.{key} {value}")
    return out


def transformer_section(values: Any, source: str) -> tuple[dict[str, Any], str]:
    """The transformer settings in a fit config (`model.transformer`) or a bare transformer config, and the
    dotted prefix of their keys in that file (`model.transformer.`, `transformer.` or none)."""
    if not isinstance(values, dict):
        raise ConfigError(f"{source} is not a YAML mapping")
    model = values.get("model")
    if isinstance(model, dict):
        model = model.get("init_args", model)
        if isinstance(model.get("transformer"), dict):
            return model["transformer"], "model.transformer."
        if "transformer" in model:
            raise ConfigError(f"{source}: model.transformer is not a mapping")
        return {}, "model.transformer."  # a fit config that keeps the model of the files before it
    if "transformer" in values:
        return dict(values["transformer"] or {}), "transformer."
    return values, ""


def checked_section(values: Any, source: str) -> dict[str, Any]:
    """A file's transformer settings, each key known to [TransformerConfig][attnx.model.TransformerConfig] (a
    misspelt one is a usage error naming the file, the key and the one it meant)."""
    from attnx.commands.usage import option_names, unknown_key_error, unknown_keys

    section, prefix = transformer_section(values, source)
    fields = [name.removeprefix("--") for name in option_names(TransformerConfig)]
    if not prefix:  # a fit config without a model section, or a bare transformer config
        section = {key: value for key, value in section.items() if key not in FIT_SECTIONS}
    for key in unknown_keys(section, fields):
        raise unknown_key_error(source, prefix + key, [prefix + field for field in fields])
    return section


FIT_SECTIONS = (
    "seed_everything",
    "trainer",
    "data",
    "evaluation",
    "progress",
    "throughput",
    "best",
    "ema",
    "lora",
    "init_from",
    "optimizer",
    "lr_scheduler",
    "ckpt_path",
    "torch_threads",
    "cuda_graphs",
)
"""The top-level keys of a fit config other than `model`: a file of only these (an override of the training
length, say) leaves the model of the files before it."""


def merged(earlier: dict[str, Any], later: dict[str, Any], schema: type) -> dict[str, Any]:
    """Settings of several config files as `attnx fit --config A --config B` merges them (jsonargparse):
    a later file's keys win, a settings group (a component's `name` and `args`) merges key by key, and any
    other value, a mapping of `args` included, is replaced whole."""
    hints = typing.get_type_hints(schema)
    out = dict(earlier)
    for key, value in later.items():
        kind = hints.get(key)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, dict):
            out[key] = merged(out.get(key) if isinstance(out.get(key), dict) else {}, value, kind)
        else:
            out[key] = value
    return out


def over_files(section: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The transformer settings `section` of the config files with the command line's `options` over them:
    as `attnx fit` takes `--model.transformer.self_attention.args.kv_heads 2`, one key of a component's args
    changes and its other args stay."""
    options = dict(options)
    for slot, spec in options.items():
        if isinstance(spec, dict) and "args" in spec and isinstance(section.get(slot), dict):
            options[slot] = {**spec, "args": {**(section[slot].get("args") or {}), **spec["args"]}}
    return merged(section, options, TransformerConfig)


def in_section(values: Any, name: str, options: dict[str, Any]) -> Any:
    """Fit config `values` with `options` over its section `name` (inside its `init_args` where it has them)."""
    from attnx.commands.fit_sections import files_merged

    if not options:
        return values
    section = values.get(name) if isinstance(values, dict) else None
    if isinstance(section, dict) and isinstance(section.get("init_args"), dict):
        return files_merged(values, {name: {"init_args": options}})
    return files_merged(values, {name: options})


def corpus_of(values: Any, path: Path) -> tuple[Any, Path] | None:
    """The `data.data_dir` a fit config file sets, with the folder of that file, or None."""
    data = values.get("data") if isinstance(values, dict) else None
    data = data.get("init_args", data) if isinstance(data, dict) else None
    if not isinstance(data, dict) or "data_dir" not in data:
        return None
    return data["data_dir"], path.parent


def data_vocab_size(data_dir: Any, base: Path) -> int | None:
    """The vocabulary size of the prepared corpus at `data_dir` (from here, else from `base`, the folder of
    the config that names it), if that corpus exists."""
    from attnx.data.corpus import META, PreparedCorpus
    from attnx.data.errors import DataError

    for root in (Path.cwd(), base):
        directory = root / str(data_dir)
        if (directory / META).is_file():
            try:
                return int(PreparedCorpus(directory).vocab_size)
            except DataError:  # prepared by another version of attnx: its vocabulary is not known here
                continue
    return None


def describe(
    config: str | list[str] | None = None,
    preset: Literal["base", "big"] | None = None,
    vocab_size: int | None = None,
    seq_len: int = 25,
    device: Literal["h100", "h200", "a100", "cpu"] | None = None,
    precision: str | None = None,
    mfu: float | None = None,
    devices: int | None = None,
    model: ModelOptions = ModelOptions(),  # noqa: B008  (options none of which is given: never changed)
    trainer: TrainerOptions = TrainerOptions(),  # noqa: B008
    data: DataOptions = DataOptions(),  # noqa: B008
    lora: LoraOptions = LoraOptions(),  # noqa: B008
) -> int:
    """Print a model's parameters and training FLOPs per token; with --device, estimated memory and time too.

    With --device: the memory per device and the time per step and per run; needs no data and no GPU.

    The vocabulary size is, in this order: --vocab_size, the config's model.transformer.vocab_size, that of
    the prepared corpus the config's data.data_dir names (when it exists here), else the paper's 37,000.
    Where that corpus exists, its training batches are counted too: how many an epoch, in how many tensor
    shapes (data.shape_buckets), and their share of padding. The estimate (attnx.training.estimate) takes the
    config's data.max_tokens, trainer.accumulate_grad_batches, max_steps and max_time. Where the config has
    LoRA adapters (lora.rank), their parameters are counted, and only they have gradients and Adam's moments.

    The options of `attnx fit` that change these are taken as fit takes them, over the config files (or the
    preset): e.g. --model.transformer.d_model 256, --model.transformer.feedforward.name swiglu,
    --model.transformer.self_attention.args.kv_heads 2, --trainer.max_steps 1000, --data.max_tokens 8192,
    --lora.rank 8.

    Args:
        config: A fit config (its model.transformer section) or a transformer YAML: a path or a packaged name.
            Given several times (--config base --config mine.yaml), the files merge as attnx fit merges them:
            a later file's keys win, the others stay.
        preset: The paper's base or big model (Table 3).
        vocab_size: Shared vocabulary size.
        seq_len: Source and target length for the FLOPs count.
        device: Estimate memory and time on one such device: an NVIDIA H100 or H200 (SXM) or A100 from their
            data sheets' dense peaks, or this CPU (its matrix-product rate measured now).
        precision: The precision of the estimate; default the config's trainer.precision, else bf16-mixed on a
            GPU and on CPU what `attnx fit` would choose.
        mfu: Model FLOPs utilization the time estimate assumes (a fraction of the device's peak); default 0.35
            on a GPU, and on the CPU 0.65 in fp32 (what attnx's CPU runs measure), less in bf16, whose units
            speed up the matrix products alone.
        devices: Devices the run would use; default the config's trainer.devices. Fewer multiply
            accumulate_grad_batches to keep the tokens of a step, as the configs' comments advise.
        model: The model settings of `attnx fit` (--model.transformer.*), over the config's.
        trainer: The trainer settings of `attnx fit` the estimate reads, over the config's.
        data: The data settings of `attnx fit` that decide the training batches, over the config's.
        lora: The LoRA adapters of `attnx fit` (--lora.rank ...), over the config's.
    """
    from attnx.commands.fit_sections import batch_plan, files_merged, run_estimate
    from attnx.commands.fit_sections import section as fit_section
    from attnx.model import build_transformer
    from attnx.model.builders import count_parameters, decoding_cache_values, training_flops_per_token

    if (config is None) == (preset is None):
        raise ConfigError("give either --config or --preset")
    options = given(model).get("transformer", {})
    values: Any = {}
    data_dir: tuple[Any, Path] | None = None
    vocab_set = False
    if preset:
        section = getattr(TransformerConfig, preset)().to_dict()
        label = f"preset {preset}"
    else:
        import yaml

        from attnx.configs import resolve

        paths = [resolve(name) for name in ([config] if isinstance(config, str) else config)]
        section = dataclasses.asdict(TransformerConfig())  # what fit starts from, before its files
        for path in paths:
            read = yaml.safe_load(path.read_text(encoding="utf-8"))
            settings = checked_section(read, str(path))
            section = merged(section, settings, TransformerConfig)
            vocab_set = vocab_set or "vocab_size" in settings
            data_dir = corpus_of(read, path) or data_dir
            values = files_merged(values, read)  # the trainer, data and lora sections of all the files
        label = " + ".join(map(str, paths))
    model_config = TransformerConfig.from_dict(over_files(section, options))
    label += "".join(f" + {option}" for option in flat(options, "model.transformer"))
    for name, group in (("trainer", trainer), ("data", data), ("lora", lora)):
        values = in_section(values, name, given(group))
    if "data_dir" in given(data):  # a path on the command line: from here
        data_dir = given(data)["data_dir"], Path.cwd()
    if vocab_set:
        vocab_source = "the config's"
    elif data_dir and (found := data_vocab_size(*data_dir)) is not None:
        model_config.vocab_size, vocab_source = found, "the prepared corpus's"
    else:
        vocab_source = "the paper's" + (
            "" if preset else "; no prepared corpus found, --vocab_size sets another"
        )
    if vocab_size:
        model_config.vocab_size, vocab_source = vocab_size, "--vocab_size"
    built = build_transformer(model_config)
    params, trainable = count_parameters(built), None
    adapters = fit_section(values, "lora")
    if adapters.get("rank") is not None:  # the fit config's adapters: only they train
        try:
            params, trainable = LowRankAdapters(**adapters).parameters(built)
        except TypeError as err:
            raise ConfigError(f"lora section of {label}: {err}") from None
    flops = training_flops_per_token(model_config, seq_len, seq_len)
    c = model_config
    print(f"model: {label}")
    print(
        f"  d_model {c.d_model}, d_ff {c.d_ff}, heads {c.n_heads}, layers {c.encoder_layers}+{c.decoder_layers}, "
        f"dropout {c.dropout}, vocab {c.vocab_size} ({vocab_source}), shared embeddings {c.share_embeddings}"
    )
    print(
        f"  components: self-attention {c.self_attention.name}, cross-attention {c.cross_attention.name}, "
        f"feed-forward {c.feedforward.name}, positional {c.positional.name}, norm {c.norm.name} ({c.norm_position})"
    )
    print(
        f"parameters: {params:,} ({params / 1e6:.1f}M)"
        + (
            f"; {trainable:,} of them train (lora rank {adapters['rank']}), the rest frozen"
            if trainable
            else ""
        )
    )
    print(
        f"training FLOPs per token (source+target, length {seq_len} each): "
        f"{flops['per_token'] / 1e6:.1f} MFLOP; per target token: {flops['per_target_token'] / 1e6:.1f} MFLOP"
    )
    cache = {k: f"{2 * n:,} bytes per {k[4:].replace('_', ' ')}" for k, n in decoding_cache_values(c).items()}
    print(f"decoding cache per sentence (keys and values, 2 bytes each in bf16): {', '.join(cache.values())}")
    plan = batch_plan(values, data_dir[1]) if data_dir else None
    if plan:
        print(plan)
    if device is None:
        print("memory and time: add --device h100|h200|a100|cpu for an estimate")
        return 0
    for line in run_estimate(
        values, model_config, params, device, precision, mfu, seq_len, devices, trainable
    ):
        print(line)
    return 0
