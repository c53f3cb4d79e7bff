"""``attnx fit | validate | test | predict --config FILE``: LightningCLI over TranslationTask and the data.

Everything a run needs is in its config (``--print_config`` shows all of it; any key can be overridden on the
command line, e.g. ``--trainer.max_steps 1000``) and the full config is saved beside every run as
``config.yaml``. ``--config`` takes a file or the name of a packaged config (``attnx configs`` lists them).
The vocabulary size is linked from the data to ``model.transformer.vocab_size``. The ``evaluation`` section
configures decoding and BLEU ([TranslationEvaluator][attnx.training.evaluation.TranslationEvaluator]); the
``progress`` section the console lines ([ProgressLog][attnx.training.progress.ProgressLog]). Checkpoints are
written atomically and read with ``weights_only=True``.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import torch
from jsonargparse import ArgumentError
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger

from attnx.checkpoint import read_checkpoint
from attnx.training.checkpointing import AtomicCheckpointIO
from attnx.training.evaluation import TranslationEvaluator
from attnx.training.module import TranslationTask
from attnx.training.precision import resolve_cpu_precision
from attnx.training.progress import ProgressLog
from attnx.training.throughput import TokenThroughput

GPU_ACCELERATORS = ("gpu", "cuda")
DECODING_COMMANDS = ("validate", "test", "predict")
SUBCOMMANDS = ("fit", *DECODING_COMMANDS)


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
        "`--trainer.accelerator cpu --trainer.devices 1 --trainer.strategy auto --trainer.precision 32-true` "
        f"(and multiply --trainer.accumulate_grad_batches by {wanted} to keep the tokens per step)"
    )


def model_from_checkpoint(ckpt_path: str) -> dict[str, Any]:
    """The ``model.transformer`` values of a checkpoint (its vocabulary size is linked from the data)."""
    transformer = dict(read_checkpoint(ckpt_path)["attnx"]["transformer"])
    transformer.pop("vocab_size")  # a mismatch with the data is reported when the weights load
    return transformer


def resolve_configs(argv: list[str]) -> list[str]:
    """``--config NAME`` → the packaged config's path, when NAME is not a file here."""
    from attnx.configs import resolve

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            argv[i + 1] = str(resolve(argv[i + 1]))
        elif arg.startswith("--config="):
            argv[i] = "--config=" + str(resolve(arg.split("=", 1)[1]))
    return argv


def checkpoint_override(argv: list[str]) -> list[str]:
    """For validate/test/predict with ``--ckpt_path``: the model comes from the checkpoint (it must fit the
    weights), so its ``model.transformer`` values are appended to the command line, after the config.

    Decoding settings, output file and data stay those of the config and the command line.
    """
    ckpt = None
    for i, arg in enumerate(argv):
        if arg == "--ckpt_path" and i + 1 < len(argv):
            ckpt = argv[i + 1]
        elif arg.startswith("--ckpt_path="):
            ckpt = arg.split("=", 1)[1]
    if not ckpt or ckpt in ("last", "best", "hpc", "registry", "null"):
        return argv
    import json

    return [*argv, "--model.transformer", json.dumps(model_from_checkpoint(ckpt))]


class AttnxCLI(LightningCLI):
    """LightningCLI with attnx's links, checks, callbacks and checkpoint handling."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.vocab_size", "model.transformer.vocab_size", apply_on="instantiate")
        parser.add_lightning_class_args(TranslationEvaluator, "evaluation")
        parser.add_lightning_class_args(ProgressLog, "progress")
        parser.add_lightning_class_args(TokenThroughput, "throughput")
        parser.add_argument(
            "--torch_threads",
            type=int | None,
            default=None,
            help="CPU threads for PyTorch's kernels (torch.set_num_threads); None keeps PyTorch's default "
            "(one per core). On a CPU shared with other jobs, fewer threads than cores avoids stalls.",
        )

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        if subcommand in DECODING_COMMANDS and not config.get("ckpt_path"):
            raise ConfigError(
                f"attnx {subcommand} needs weights: pass --ckpt_path CHECKPOINT (e.g. "
                "runs/NAME/version_0/checkpoints/averaged.ckpt), or set ckpt_path in the config; without it "
                "the model would be randomly initialised"
            )
        trainer = config.get("trainer") or {}
        check_devices(trainer)
        if subcommand == "fit" and (choice := resolve_cpu_precision(trainer)):
            print(choice.line(), flush=True)  # trainer.precision unset: chosen from the CPU's bf16 units
        pin_log_versions(trainer)
        threads = config.get("torch_threads")
        if threads:
            torch.set_num_threads(threads)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        subcommand = self.config.get("subcommand")
        init = self.config_init.get(subcommand, self.config_init) if subcommand else self.config_init
        plugins = (init.get("trainer") or {}).get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        return super().instantiate_trainer(plugins=plugins, **kwargs)


def pin_log_versions(trainer: Any) -> None:
    """Give the TensorBoard and CSV loggers that share a folder one version number, so a run has one folder
    (left alone, each takes the next free ``version_N`` after the other has created its own)."""
    loggers = trainer.get("logger") if hasattr(trainer, "get") else None
    if not isinstance(loggers, list):
        return
    groups: dict[tuple[str, str], list[Any]] = {}
    for logger in loggers:
        args = logger.get("init_args") if hasattr(logger, "get") else None
        if args is None or args.get("version") is not None or "save_dir" not in args:
            continue
        groups.setdefault((str(args["save_dir"]), str(args.get("name") or "lightning_logs")), []).append(args)
    for (save_dir, name), members in groups.items():
        if len(members) > 1:
            version = CSVLogger(save_dir, name).version  # the next free version_N; nothing is written
            for args in members:
                args["version"] = version


def quiet_third_parties() -> None:
    """Keep Lightning's tips, adverts and hardware lines off the console; real warnings stay."""
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
        "lightning.fabric.utilities.seed",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (
        "LightningCLI's args parameter is intended",  # attnx passes its own argv on
        ".*does not have many workers.*",  # token-budget batches are gathered in the main process by design
        ".*is not resumable.*",  # the DataModule restores its sampler itself
        ".*Consider setting `persistent_workers=True`.*",
        ".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
    ):
        warnings.filterwarnings("ignore", message=message)


def main(argv: list[str] | None = None) -> int:
    """Run ``attnx <fit|validate|test|predict> [options]``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from attnx.data.datamodule import TranslationDataModule

    subcommand = argv[0] if argv else ""
    if subcommand in SUBCOMMANDS and len(argv) == 1:
        raise ConfigError(
            f"attnx {subcommand} needs a config: attnx {subcommand} --config FILE_OR_NAME (`attnx configs` lists "
            f"the packaged ones, e.g. --config multi30k_cpu); `attnx {subcommand} --help` lists every option"
        )
    argv = resolve_configs(argv)
    if subcommand in DECODING_COMMANDS:
        argv = checkpoint_override(argv)
    quiet_third_parties()
    no_exit = {"exit_on_error": False}
    try:
        AttnxCLI(
            TranslationTask,
            TranslationDataModule,
            args=argv,
            seed_everything_default=1,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"prog": "attnx", **no_exit, **{name: dict(no_exit) for name in SUBCOMMANDS}},
            trainer_defaults={"enable_progress_bar": sys.stderr.isatty()},
        )
    except ArgumentError as err:
        from attnx.cli import UsageError, one_line, suggest

        raise UsageError(suggest(one_line(str(err)), option_names())) from err
    return 0


def option_names() -> list[str]:
    """Every ``--section.key`` a fit/test config accepts, for "did you mean" hints."""
    from attnx.cli import option_names as keys
    from attnx.data.datamodule import TranslationDataModule

    names = ["--config", "--print_config", "--ckpt_path", "--seed_everything", "--torch_threads"]
    for prefix, target in {
        "trainer": Trainer.__init__,
        "model": TranslationTask.__init__,  # with model.transformer.* and model.loss.*
        "data": TranslationDataModule.__init__,
        "evaluation": TranslationEvaluator.__init__,  # with evaluation.search.*
        "progress": ProgressLog.__init__,
        "throughput": TokenThroughput.__init__,
    }.items():
        names += keys(target, prefix)
    return names
