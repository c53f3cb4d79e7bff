"""``attnx fit | validate | test | predict --config FILE``: LightningCLI over TranslationTask and the data.

Everything a run needs is in its config (``--print_config`` shows all of it; any key can be overridden on the
command line, e.g. ``--trainer.max_steps 1000``) and the full config is saved beside every run as
``config.yaml``. The vocabulary size is linked from the data to ``model.transformer.vocab_size``.
Checkpoints are written atomically and read with ``weights_only=True``.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from attnx.checkpoint import CheckpointError, read_checkpoint
from attnx.registry import UnknownComponentError
from attnx.training.checkpointing import AtomicCheckpointIO
from attnx.training.module import NonFiniteLossError, TranslationTask

GPU_ACCELERATORS = ("gpu", "cuda")


class ConfigError(ValueError):
    """A config that cannot run here; the message says what to override."""


def _requested_devices(devices: Any) -> int:
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str):
        if devices in ("auto", "-1"):
            return 1
        return len(devices.split(",")) if "," in devices else int(devices)
    return 1 if devices in (None, -1) else int(devices)


def check_devices(trainer: dict[str, Any], available: int | None = None) -> None:
    """Fail in one sentence when the config asks for more GPUs than this machine has."""
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator not in GPU_ACCELERATORS:
        return
    wanted = _requested_devices(trainer.get("devices", "auto"))
    available = torch.cuda.device_count() if available is None else available
    if available >= wanted:
        return
    raise ConfigError(
        f"this config trains on {wanted} GPU{'s' * (wanted > 1)} (trainer.accelerator {accelerator}, "
        f"trainer.devices {trainer.get('devices')}) but this machine has {available}; to run it here add "
        "`--trainer.accelerator cpu --trainer.devices 1 --trainer.precision 32-true` (and multiply "
        f"--trainer.accumulate_grad_batches by {wanted} to keep the tokens per step)"
    )


class AttnxCLI(LightningCLI):
    """LightningCLI with attnx's links, checks and checkpoint handling."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.vocab_size", "model.transformer.vocab_size", apply_on="instantiate")
        parser.add_argument(
            "--torch_threads",
            type=int | None,
            default=None,
            help="CPU threads for PyTorch's kernels (torch.set_num_threads); None keeps PyTorch's default "
            "(one per core). On a CPU shared with other jobs, fewer threads than cores avoids stalls.",
        )

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path``, the model architecture comes from the checkpoint (it must fit the weights);
        everything else (decoding settings, output file, data) from the config and the command line.

        Replaces LightningCLI's version, which would also override the command line's decoding settings
        with the values the checkpoint was trained with.
        """
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):
            return
        transformer = dict(read_checkpoint(ckpt_path)["attnx"]["transformer"])
        transformer.pop("vocab_size")  # linked from the data; a mismatch is reported when the weights load
        self.config = self.parser.parse_object(
            {subcommand: {"model": {"transformer": transformer}}}, self.config
        )

    def before_instantiate_classes(self) -> None:
        check_devices(self._get(self.config, "trainer", default={}))
        threads = self._get(self.config, "torch_threads")
        if threads:
            torch.set_num_threads(threads)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        plugins = self._get(self.config_init, "trainer", default={}).get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        trainer = super().instantiate_trainer(plugins=plugins, **kwargs)
        _share_log_version(trainer)
        return trainer


def _share_log_version(trainer: Trainer) -> None:
    """TensorBoard and CSV loggers with the same save_dir/name pick their version folders one after the
    other (version_0, then version_1); give them the first one's, so a run has one folder."""
    loggers = [lg for lg in trainer.loggers if isinstance(lg, (TensorBoardLogger, CSVLogger))]
    if len(loggers) < 2:
        return
    first = loggers[0]
    for logger in loggers[1:]:
        if logger.root_dir == first.root_dir and logger._version is None:
            logger._version = first.version


def main(argv: list[str] | None = None) -> int:
    """Run ``attnx <fit|validate|test|predict> [options]``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from attnx.data.datamodule import TranslationDataModule

    # `attnx` passes its own argv on; LightningCLI would warn that sys.argv holds arguments too.
    warnings.filterwarnings(
        "ignore", message="LightningCLI's args parameter is intended", category=UserWarning
    )
    try:
        AttnxCLI(
            TranslationTask,
            TranslationDataModule,
            args=argv,
            seed_everything_default=1,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"prog": "attnx"},
        )
    except (ConfigError, UnknownComponentError, CheckpointError) as err:
        print(f"attnx {argv[0] if argv else ''}: error: {err}", file=sys.stderr)
        return 2
    except NonFiniteLossError as err:
        print(f"attnx {argv[0]}: error: {err}", file=sys.stderr)
        return 1
    return 0
