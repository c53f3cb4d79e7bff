"""What `attnx describe` reads off a fit config's sections beside the model: the training batches of the
prepared corpus its `data` names, and the memory and time estimate from its `trainer` and `data`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnx.errors import ConfigError

if TYPE_CHECKING:
    from attnx.training.fit_estimate import RecipePace


def files_merged(earlier: Any, later: Any) -> Any:
    """Two fit config files' settings as `attnx fit --config A --config B` reads them: a later file's keys win,
    mappings merge key by key, any other value (a list of callbacks, say) is replaced whole."""
    if not isinstance(earlier, dict) or not isinstance(later, dict):
        return later
    out = dict(earlier)
    for key, value in later.items():
        out[key] = (
            files_merged(out[key], value)
            if isinstance(out.get(key), dict) and isinstance(value, dict)
            else value
        )
    return out


def section(values: Any, name: str) -> dict[str, Any]:
    """The settings of section `name` of a fit config (its `init_args` where it has them), else {}."""
    section = values.get(name) if isinstance(values, dict) else None
    section = section.get("init_args", section) if isinstance(section, dict) else None
    return section if isinstance(section, dict) else {}


def batch_plan(values: Any, base: Path) -> str | None:
    """The training batches of the prepared corpus a fit config names, in one line, when it exists here."""
    from attnx.data.corpus import META
    from attnx.data.datamodule import PLAN_OPTIONS, TranslationDataModule, auto_shape_buckets
    from attnx.data.errors import DataError

    data = section(values, "data")
    if "data_dir" not in data:
        return None
    for root in (Path.cwd(), base):
        directory = root / str(data["data_dir"])
        if (directory / META).is_file():
            try:
                options = {k: data[k] for k in PLAN_OPTIONS if data.get(k) is not None}
                datamodule = TranslationDataModule(str(directory), **options)
                if "shape_buckets" not in options:  # what `attnx fit` chooses from its precision and device
                    trainer = section(values, "trainer")
                    on_gpu = str(trainer.get("accelerator", "auto")) in ("gpu", "cuda")
                    precision = trainer.get("precision")
                    if precision is None and not on_gpu:  # chosen from this CPU's bf16 units, as fit does
                        from attnx.training.precision import kept_cpu_precision

                        precision = kept_cpu_precision().precision
                    datamodule.shape_buckets = auto_shape_buckets(str(precision), on_gpu)
                return datamodule.train_sampler.summary()
            except (DataError, OSError, KeyError, ValueError) as err:
                return f"batches: not counted, {directory} cannot be read as a prepared corpus ({err!r})"
    return None


def run_estimate(
    values: Any,
    model_config: Any,
    parameters: int,
    device: str,
    precision: str | None,
    mfu: float | None,
    seq_len: int,
    devices: int | None = None,
    trainable: int | None = None,
) -> list[str]:
    """The estimate lines of `describe --device`, from the config's trainer and data sections; `trainable`:
    the parameters that train where not all do (LoRA)."""
    from attnx.training.estimate import estimate_run, larger_batches
    from attnx.training.fit_estimate import undertrained_line
    from attnx.training.precision import FP32, kept_cpu_precision

    trainer, data = section(values, "trainer"), section(values, "data")
    precision = precision or trainer.get("precision")
    if not precision:
        precision = kept_cpu_precision().precision if device == "cpu" else "bf16-mixed"
    if device != "cpu" and str(precision).startswith("32"):
        precision = FP32
    max_tokens = int(data.get("max_tokens") or 4096)
    accumulate = int(trainer.get("accumulate_grad_batches") or 1)
    configured = trainer.get("devices")
    configured = configured if isinstance(configured, int) and configured > 0 else 1
    devices = devices or configured
    if devices < 1:
        raise ConfigError(f"--devices must be at least 1, got {devices}")
    if devices != configured:  # the same tokens a step: accumulate what the missing devices would have done
        accumulate = max(1, round(accumulate * configured / devices))
    estimate = estimate_run(
        model_config,
        parameters,
        max_tokens,
        str(precision),
        device,
        accumulate=accumulate,
        max_steps=trainer.get("max_steps"),
        max_time_seconds=max_time_seconds(trainer.get("max_time")),
        mfu=mfu,
        src_len=seq_len,
        tgt_len=seq_len,
        captured=captures(values, device, devices, accumulate),
        trainable=trainable,
    )
    batch = f"{accumulate} batch{'es' * (accumulate > 1)} of {max_tokens:,} tokens per side a step"
    where = f" on each of {devices} devices" if devices > 1 else " on 1 device"
    lines = estimate.lines()
    pace, seconds = recipe_pace(trainer), max_time_seconds(trainer.get("max_time"))
    warning = (
        undertrained_line(pace, estimate, seconds, trainer.get("max_steps")) if pace and seconds else None
    )
    lines += [warning] if warning else []
    if device != "cpu":
        interval = trainer.get("val_check_interval")
        if isinstance(interval, int) and devices != configured:  # it counts batches: as many a step
            interval = max(1, round(interval * configured / devices))
        hint = larger_batches(estimate, model_config, max_tokens, seq_len, seq_len, interval)
        lines += [hint] if hint else []
    return [f"estimate ({device}, {precision}, {batch}{where}; estimates, not measurements):"] + [
        f"  {line}" for line in lines
    ]


def recipe_pace(trainer: dict[str, Any]) -> RecipePace | None:
    """The [RecipePace][attnx.training.fit_estimate.RecipePace] among a fit config's `trainer.callbacks`, if any."""
    from attnx.training.fit_estimate import RecipePace

    callbacks = trainer.get("callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        if isinstance(callback, dict) and str(callback.get("class_path")).rpartition(".")[2] == "RecipePace":
            try:
                return RecipePace(**(callback.get("init_args") or {}))
            except TypeError as err:  # a key it does not take, or one missing
                raise ConfigError(
                    f"RecipePace (trainer.callbacks): {err}; it takes steps and minutes"
                ) from None
    return None


def captures(values: Any, device: str, devices: int, accumulate: int) -> bool:
    """Whether `attnx fit` would capture this config's steps on `device` (attnx.training.captured_steps): a
    GPU, `cuda_graphs` not false, shape buckets (or `cuda_graphs: true`), and not DDP without accumulation."""
    enabled = values.get("cuda_graphs") if isinstance(values, dict) else None
    buckets = section(values, "data").get("shape_buckets")
    return (
        device != "cpu"
        and enabled is not False
        and (buckets != 0 or enabled is True)
        and not (devices > 1 and accumulate == 1)
    )


def max_time_seconds(value: Any) -> float | None:
    """Lightning's `max_time` (`DD:HH:MM:SS`, or a mapping of timedelta fields) in seconds."""
    import datetime

    if not value:
        return None
    if isinstance(value, dict):
        return datetime.timedelta(**value).total_seconds()
    days, hours, minutes, seconds = (int(x) for x in str(value).split(":"))
    return datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
