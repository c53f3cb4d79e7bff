"""`attnx average`, `attnx configs`, `attnx plugins` and `attnx describe`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from attnx.errors import ConfigError


def average(
    checkpoints: Path | list[Path] | None = None,
    dir: Path | None = None,
    last: int = 5,
    output: Path = Path("averaged.ckpt"),
    force: bool = False,
) -> int:
    """Average the weights of several checkpoints of one run into one decodable checkpoint.

    §6.1: the last 5 checkpoints for the base model, the last 20 for the big one. The result carries no
    optimizer state: it decodes (attnx test, attnx translate) but does not resume training.
    Example: attnx average --dir runs/base/version_0/checkpoints --last 5 --output base.ckpt

    Args:
        checkpoints: Checkpoint files to average: --checkpoints '[a.ckpt, b.ckpt]'.
        dir: Take the newest checkpoints by training step from this directory instead: the step=N.ckpt
            files, and last.ckpt where it holds a later step (a run stopped between two saves).
        last: With --dir: how many of the newest.
        output: Where to write the averaged checkpoint.
        force: Replace the --output file if it exists (otherwise an existing file is left and the command stops).
    """
    import sys

    from attnx.checkpoint import CheckpointError, atomic_save, average_checkpoints, last_checkpoints
    from attnx.checkpoint.ema import checkpoint_weights_line
    from attnx.commands.usage import refuse_to_replace

    if bool(checkpoints) == bool(dir):
        raise ConfigError("give either --checkpoints or --dir (with --last k), not both and not neither")
    if last < 1:
        raise ConfigError(f"--last must be at least 1, got {last}")
    if isinstance(checkpoints, Path):
        checkpoints = [checkpoints]
    paths = last_checkpoints(dir, last) if dir else list(checkpoints or [])
    if dir and len(paths) < last:
        print(f"attnx average: only {len(paths)} checkpoints in {dir}; averaging those", file=sys.stderr)
    if not paths:
        raise CheckpointError("no checkpoints to average")
    refuse_to_replace(output, force)
    atomic_save(average_checkpoints(paths), output)
    if ema := checkpoint_weights_line(paths[-1], "average"):
        print(ema)
    print(f"averaged {len(paths)} checkpoints into {output}:")
    for path in paths:
        print(f"  {path}")
    return 0


def configs() -> int:
    """List the configs shipped with attnx, one line each; pass a name to --config (attnx fit --config base)."""
    from attnx.configs import available

    found = available()
    width = max(map(len, found), default=0)
    for name, line in found.items():
        print(f"{name:<{width}}  {line}")
    return 0


def plugins() -> int:
    """List every registered component by kind, with the plugin and distribution it came from."""
    from attnx.plugins import registry
    from attnx.registry import Kind

    reg = registry()
    for kind in Kind:
        print(f"{kind}:")
        for entry in (e for e in reg.entries() if e.kind == kind):
            cls = f"{entry.factory.__module__}.{entry.factory.__qualname__}"
            print(f"  {entry.name:<16} {cls}  [{entry.distribution}]")
    return 0


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
    from attnx.model import TransformerConfig

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
    import dataclasses
    import typing

    hints = typing.get_type_hints(schema)
    out = dict(earlier)
    for key, value in later.items():
        kind = hints.get(key)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, dict):
            out[key] = merged(out.get(key) if isinstance(out.get(key), dict) else {}, value, kind)
        else:
            out[key] = value
    return out


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
) -> int:
    """Print a model's parameters and training FLOPs per token; with --device, estimated memory and time too.

    With --device: the memory per device and the time per step and per run; needs no data and no GPU.

    The vocabulary size is, in this order: --vocab_size, the config's model.transformer.vocab_size, that of
    the prepared corpus the config's data.data_dir names (when it exists here), else the paper's 37,000.
    Where that corpus exists, its training batches are counted too: how many an epoch, in how many tensor
    shapes (data.shape_buckets), and their share of padding. The estimate (attnx.training.estimate) takes the
    config's data.max_tokens, trainer.accumulate_grad_batches, max_steps and max_time. Where the config has
    LoRA adapters (lora.rank), their parameters are counted, and only they have gradients and Adam's moments.

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
    """
    import dataclasses

    import yaml

    from attnx.commands.fit_sections import batch_plan, files_merged, run_estimate
    from attnx.commands.fit_sections import section as fit_section
    from attnx.model import TransformerConfig, build_transformer
    from attnx.model.builders import count_parameters, decoding_cache_values, training_flops_per_token

    if (config is None) == (preset is None):
        raise ConfigError("give either --config or --preset")
    vocab_source = "--vocab_size"
    values: Any = {}
    if preset:
        model_config = getattr(TransformerConfig, preset)()
        label = f"preset {preset}"
        vocab_source = "the paper's"
    else:
        from attnx.configs import resolve

        paths = [resolve(name) for name in ([config] if isinstance(config, str) else config)]
        section = dataclasses.asdict(TransformerConfig())  # what fit starts from, before its files
        data_dir: tuple[Any, Path] | None = None
        vocab_set = False
        for path in paths:
            read = yaml.safe_load(path.read_text(encoding="utf-8"))
            settings = checked_section(read, str(path))
            section = merged(section, settings, TransformerConfig)
            vocab_set = vocab_set or "vocab_size" in settings
            data_dir = corpus_of(read, path) or data_dir
            values = files_merged(values, read)  # the trainer, data and lora sections of all the files
        model_config = TransformerConfig.from_dict(section)
        label = " + ".join(map(str, paths))
        if vocab_set:
            vocab_source = "the config's"
        elif data_dir and (found := data_vocab_size(*data_dir)) is not None:
            model_config.vocab_size, vocab_source = found, "the prepared corpus's"
        else:
            vocab_source = "the paper's; no prepared corpus found, --vocab_size sets another"
    if vocab_size:
        model_config.vocab_size, vocab_source = vocab_size, "--vocab_size"
    model = build_transformer(model_config)
    params, trainable = count_parameters(model), None
    lora = fit_section(values, "lora")
    if lora.get("rank") is not None:  # the fit config's adapters: only they train
        from attnx.training.lora import LowRankAdapters

        try:
            params, trainable = LowRankAdapters(**lora).parameters(model)
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
        + (f"; {trainable:,} of them train (lora rank {lora['rank']}), the rest frozen" if trainable else "")
    )
    print(
        f"training FLOPs per token (source+target, length {seq_len} each): "
        f"{flops['per_token'] / 1e6:.1f} MFLOP; per target token: {flops['per_target_token'] / 1e6:.1f} MFLOP"
    )
    cache = {k: f"{2 * n:,} bytes per {k[4:].replace('_', ' ')}" for k, n in decoding_cache_values(c).items()}
    print(f"decoding cache per sentence (keys and values, 2 bytes each in bf16): {', '.join(cache.values())}")
    plan = batch_plan(values, data_dir[1] if data_dir else Path.cwd()) if config else None
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
