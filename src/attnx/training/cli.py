"""`attnx fit | validate | test | predict --config FILE`: LightningCLI over TranslationTask and the data.

Everything a run needs is in its config (`--print_config` shows all of it; any key can be overridden on the
command line, e.g. `--trainer.max_steps 1000`) and the full config is saved beside every run as
`config.yaml`. `--config` takes a file or the name of a packaged config (`attnx configs` lists them).
The vocabulary size is linked from the data to `model.transformer.vocab_size`. The `evaluation` section
configures decoding and BLEU ([TranslationEvaluator][attnx.training.evaluation.TranslationEvaluator]); the
`progress` section the console lines ([ProgressLog][attnx.training.progress.ProgressLog]). Checkpoints are
written atomically and read with `weights_only=True`.

A run is one folder across its restarts ([attnx.training.runs][]): `--ckpt_path CKPT` resumes the run CKPT
belongs to, in its folder, applying the options a run may change (one line each) and refusing the others;
`--init_from CKPT` starts a new run from CKPT's weights with a fresh optimizer, schedule and step count.
"""

from __future__ import annotations

import copy
import logging
import shlex
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch
import torch
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import (
    CheckpointError,
    config_difference,
    model_state,
    read_checkpoint,
    remove_stale_temporaries,
)
from attnx.errors import ConfigError
from attnx.model import architecture
from attnx.training.checkpointing import (
    AtomicCheckpointIO,
    PeriodicCheckpoint,
    StopRequested,
    StopSignals,
    TrainingInterrupted,
    stop_signals,
)
from attnx.training.estimate import fit_estimate_lines
from attnx.training.evaluation import TranslationEvaluator
from attnx.training.module import TranslationTask
from attnx.training.optimizers import SCHEDULER_NEEDS_OPTIMIZER, choice_line, configure_optimizers
from attnx.training.precision import resolve_cpu_precision
from attnx.training.progress import ProgressLog, TrainingProgressBar
from attnx.training.runs import (
    Resumed,
    ResumeRefused,
    RunFolder,
    check_changes,
    config_changes,
    continued_version,
    logger_groups,
    model_changes,
    pin_versions,
    resumed_run,
    tensorboard_purge,
)
from attnx.training.throughput import TokenThroughput

GPU_ACCELERATORS = ("gpu", "cuda")
DECODING_COMMANDS = ("validate", "test", "predict")
SUBCOMMANDS = ("fit", *DECODING_COMMANDS)


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
    """The `model.transformer` values of a checkpoint (its vocabulary size is linked from the data)."""
    transformer = dict(read_checkpoint(ckpt_path)["attnx"]["transformer"])
    transformer.pop("vocab_size")  # a mismatch with the data is reported when the weights load
    return transformer


def resolve_configs(argv: list[str]) -> list[str]:
    """`--config NAME` → the packaged config's path, when NAME is not a file here."""
    from attnx.configs import resolve

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            argv[i + 1] = str(resolve(argv[i + 1]))
        elif arg.startswith("--config="):
            argv[i] = "--config=" + str(resolve(arg.split("=", 1)[1]))
    return argv


def checkpoint_override(argv: list[str]) -> list[str]:
    """For validate/test/predict with `--ckpt_path`: the model comes from the checkpoint (it must fit the
    weights), so its `model.transformer` values are appended to the command line, after the config.

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

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, with a `--config` that names the file and the meant key of a misspelt one."""
        from attnx.commands.usage import config_file_action

        kwargs.setdefault("dump_header", [f"lightning.pytorch=={lightning.pytorch.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c",
            "--config",
            action=config_file_action(),
            help="Path to a configuration file in json or yaml format.",
        )
        return parser

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
        parser.add_argument(
            "--init_from",
            type=str | None,
            default=None,
            help="fit: start a new run from this checkpoint's weights, with a fresh optimizer, schedule and step "
            "count (fine-tuning, domain adaptation, the second stage of back-translation); the config's model "
            "must have the checkpoint's architecture. --ckpt_path instead resumes the checkpoint's run.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        self.resumed: Resumed | None = None
        self.run_config = ""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        if config.get("init_from") and subcommand != "fit":
            raise ConfigError(
                f"--init_from is for attnx fit; attnx {subcommand} reads weights from --ckpt_path"
            )
        if config.get("init_from") and config.get("ckpt_path"):
            raise ConfigError(
                f"--init_from {config['init_from']} and --ckpt_path {config['ckpt_path']} both given: --ckpt_path "
                "resumes a run (its optimizer, schedule and step), --init_from starts a new one from the weights; "
                "pass one of them"
            )
        config["ckpt_path"] = checked_checkpoint(subcommand, config.get("ckpt_path"), config.get("trainer"))
        if subcommand != "fit":
            return
        typed = yaml.safe_load(parser.dump(self.config, skip_link_targets=False))[subcommand]
        self.run_config = yaml.safe_dump(
            {k: v for k, v in typed.items() if k != "ckpt_path"}, sort_keys=False
        )
        self.typed = typed
        self.typed_model = copy.deepcopy(config["model"])  # Lightning replaces it with the checkpoint's
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and Path(ckpt_path).is_file():
            self.resumed = resumed_run(ckpt_path, read_checkpoint(ckpt_path))
        if config.get("init_from"):
            check_init_from(config["init_from"], typed["model"]["transformer"])

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        self.continued = False
        if subcommand == "fit":
            self.continued = self.prepare_run(config)
        else:
            pin_versions(config.get("trainer") or {}, None, None)  # one folder for the loggers of a test run
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
        if subcommand == "fit" and config.get("lr_scheduler") and not config.get("optimizer"):
            raise ConfigError(SCHEDULER_NEEDS_OPTIMIZER)  # LightningCLI would drop it without a word
        if subcommand == "fit" and config.get("optimizer"):
            print(choice_line(config["optimizer"], config.get("lr_scheduler"), config["model"]), flush=True)
        threads = config.get("torch_threads")
        if threads:
            torch.set_num_threads(threads)

    @staticmethod
    def configure_optimizers(module: Any, optimizer: Any, lr_scheduler: Any = None) -> Any:
        """`--optimizer` keeps Eq. 3 unless `--lr_scheduler` replaces it (see `attnx.training.optimizers`)."""
        return configure_optimizers(module, optimizer, lr_scheduler)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        subcommand = self.config.get("subcommand")
        init = self.config_init.get(subcommand, self.config_init) if subcommand else self.config_init
        plugins = (init.get("trainer") or {}).get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        callbacks = with_progress_bar(init.get("trainer") or {})
        if subcommand == "fit":
            if callbacks is None:
                callbacks = (init.get("trainer") or {}).get("callbacks") or []
                callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
            callbacks.append(RunFolder(self.run_config, self.resumed, self.continued))
        if callbacks is not None:
            kwargs["callbacks"] = callbacks
        return super().instantiate_trainer(plugins=plugins, **kwargs)

    def prepare_run(self, config: Any) -> bool:
        """Choose the run folder (the resumed run's, or a new one) and apply or refuse the options changed since
        the resumed checkpoint; returns whether an existing run continues."""
        trainer = config.get("trainer") or {}
        speak = rank_zero_only.rank == 0
        resumed = self.resumed
        if resumed is None:
            pin_versions(trainer, None, None)
            return False
        config["model"] = self.typed_model  # the command line's and config's model, not the checkpoint's
        if resumed.config is not None:
            changes = config_changes(resumed.config, self.typed)
        else:
            changes = model_changes(resumed.model, self.typed["model"])
        try:
            lines = check_changes(changes, resumed.checkpoint)
        except ResumeRefused as err:
            raise ConfigError(str(err)) from err
        version = continued_version(resumed, trainer)
        if speak:
            for line in lines:
                print(line, flush=True)
        if version is None:
            pin_versions(trainer, None, None)
            if speak and logger_groups(trainer):
                where = (
                    f"its run folder {resumed.log_dir} is not"
                    if resumed.log_dir
                    else "its run folder is not known, nor"
                )
                print(
                    f"resume: {resumed.checkpoint} continues in a new run folder: {where} one of this config's "
                    f"({', '.join(str(f) for f in logger_groups(trainer))})",
                    flush=True,
                )
            return False
        pin_versions(trainer, version, resumed.step)
        tensorboard_purge(trainer, resumed.step)
        return True

    def before_fit(self) -> None:
        if rank_zero_only.rank == 0:  # the plan before the hardware: memory and time, estimated
            for line in fit_estimate_lines(self.trainer, self.model, self.datamodule):
                print(line, flush=True)
        for callback in self.trainer.callbacks:
            if isinstance(callback, RunFolder):
                callback.before_fit(self.trainer)
        init_from = self.config["fit"].get("init_from")
        if init_from:
            load_initial_weights(self.model, init_from)


def check_init_from(path: str, transformer: dict[str, Any]) -> None:
    """`--init_from`: a readable checkpoint whose architecture is the config's, or one line."""
    theirs = read_checkpoint(path)["attnx"]["transformer"]
    ours = {
        k: v for k, v in transformer.items() if k != "vocab_size"
    }  # linked from the data: checked on load
    theirs_arch = {k: v for k, v in architecture(theirs).items() if k != "vocab_size"}
    if theirs_arch != architecture(ours):
        diff = config_difference(theirs_arch, architecture(ours), "checkpoint", "config")
        raise ConfigError(
            f"--init_from {path} holds another model than the config describes ({diff}); set the config's "
            "model.transformer to the checkpoint's"
        )


def load_initial_weights(task: TranslationTask, path: str) -> None:
    """Copy a checkpoint's weights into the model about to train (its vocabulary must be the data's)."""
    checkpoint = read_checkpoint(path)
    theirs, ours = checkpoint["attnx"]["transformer"]["vocab_size"], task.config.vocab_size
    if theirs != ours:
        raise ConfigError(
            f"--init_from {path} has a vocabulary of {theirs} pieces, the data {ours}: fine-tune on data prepared "
            "with the checkpoint's SentencePiece model"
        )
    task.model.load_state_dict(model_state(checkpoint))
    if rank_zero_only.rank == 0:
        print(
            f"init_from: the weights of {path} (step {checkpoint.get('global_step', '?')}); a new run, with a "
            "fresh optimizer, schedule and step count",
            flush=True,
        )


# ------------------------------------------------------------------------------------ resuming a run

LIGHTNING_KEYWORDS = ("best", "hpc", "registry")
"""`--ckpt_path` values Lightning resolves itself; `last` attnx resolves (Lightning's finds no
`ModelCheckpoint` here and would start from step 0)."""


def _get(values: Any, key: str, default: Any = None) -> Any:
    return values.get(key, default) if hasattr(values, "get") else default


def checkpoint_directories(trainer: Any) -> list[Path]:
    """The directories where this config's runs keep their checkpoints, existing ones only: the
    `PeriodicCheckpoint` `dirpath` if the config sets one, else `checkpoints/` in every `version_N`
    of its loggers' `save_dir/name` (and of `default_root_dir`)."""
    callbacks = _get(trainer, "callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        if str(_get(callback, "class_path", "")).endswith(PeriodicCheckpoint.__name__):
            dirpath = _get(_get(callback, "init_args"), "dirpath")
            if dirpath:
                return [Path(dirpath)] if Path(dirpath).is_dir() else []
    root = Path(_get(trainer, "default_root_dir") or ".")
    parents = [root, root / "lightning_logs"]
    loggers = _get(trainer, "logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = _get(logger, "init_args")
        if _get(args, "save_dir") is not None:
            parents.append(Path(_get(args, "save_dir")) / str(_get(args, "name") or "lightning_logs"))
    found = [root / "checkpoints"]
    for parent in dict.fromkeys(parents):
        found += parent.glob("version_*/checkpoints")
    return [d for d in dict.fromkeys(found) if d.is_dir()]


def last_checkpoint(trainer: Any) -> Path:
    """`--ckpt_path last`: the newest `last.ckpt` among this config's runs, or a one-line error."""
    directories = checkpoint_directories(trainer)
    found = [d / "last.ckpt" for d in directories if (d / "last.ckpt").is_file()]
    if not found:
        where = ", ".join(str(d) for d in directories) or "no run directory of this config exists here"
        raise CheckpointError(
            f"--ckpt_path last: no last.ckpt in this config's runs ({where}); pass the checkpoint's path, or "
            "leave --ckpt_path out to start a new run"
        )
    return max(found, key=lambda path: path.stat().st_mtime_ns)


def checked_checkpoint(subcommand: str, ckpt_path: Any, trainer: Any) -> Any:
    """`ckpt_path` resolved (`last`) and readable, before Lightning reads it; for `fit` also the
    leftovers of checkpoint writes that were killed are removed from this config's run directories."""
    if subcommand == "fit":
        directories = checkpoint_directories(trainer)
        if ckpt_path and ckpt_path not in ("last", *LIGHTNING_KEYWORDS):
            directories.append(Path(ckpt_path).parent)
        for directory in dict.fromkeys(directories):
            for path in remove_stale_temporaries(directory):
                print(
                    f"attnx {subcommand}: removed {path}, left by a checkpoint write that was killed",
                    file=sys.stderr,
                )
    if not ckpt_path or ckpt_path in LIGHTNING_KEYWORDS:
        return ckpt_path
    if ckpt_path == "last":
        ckpt_path = str(last_checkpoint(trainer))
        if rank_zero_only.rank == 0:  # every rank resolves it; one says so
            print(f"attnx {subcommand}: --ckpt_path last is {ckpt_path}", file=sys.stderr)
    read_checkpoint(
        ckpt_path
    )  # one line for a missing, unreadable or foreign file, before Lightning's torch.load
    return ckpt_path


def resume_command(argv: list[str], checkpoint: Path) -> str:
    """The command line that resumes an interrupted `attnx fit` from `checkpoint` (without the `--init_from` that
    started the run: the checkpoint holds its weights now)."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--ckpt_path", "--init_from"):
            skip = True
        elif not arg.startswith(("--ckpt_path=", "--init_from=")):
            args.append(arg)
    try:
        checkpoint = checkpoint.resolve().relative_to(Path.cwd())
    except ValueError:
        checkpoint = checkpoint.resolve()
    return shlex.join(["attnx", *args, "--ckpt_path", str(checkpoint)])


def interrupted(err: TrainingInterrupted, argv: list[str]) -> int:
    """Say where an interrupted run can resume from (rank 0 only) and return its exit status."""
    if err.rank == 0:
        requeued = f"; requeued Slurm job {err.requeued}" if err.requeued else ""
        print(
            f"attnx {argv[0]}: interrupted at step {err.step} ({err.signal_name}){requeued}; resume with: "
            f"{resume_command(argv, err.checkpoint)}",
            file=sys.stderr,
        )
    return err.exit_status


def with_progress_bar(trainer: dict[str, Any]) -> list[Any] | None:
    """The trainer's callbacks with attnx's [TrainingProgressBar][attnx.training.progress.TrainingProgressBar]
    added where Lightning would draw its Rich bar; None to leave them (no bar, one chosen, or no Rich)."""
    import importlib.util

    from lightning.pytorch.callbacks import ProgressBar

    callbacks = trainer.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if trainer.get("enable_progress_bar") is False or any(isinstance(c, ProgressBar) for c in callbacks):
        return None
    if importlib.util.find_spec("rich") is None:  # Lightning draws its tqdm bar, labelled "Epoch N"
        return None
    return [*callbacks, TrainingProgressBar()]


def quiet_third_parties() -> None:
    """Keep Lightning's tips, adverts and hardware lines off the console; real warnings stay."""
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
        "lightning.fabric.utilities.seed",
        "lightning.pytorch.trainer.connectors.signal_connector",  # "Received SIGTERM": attnx says what it does
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (
        "LightningCLI's args parameter is intended",  # attnx passes its own argv on
        ".*does not have many workers.*",  # token-budget batches are gathered in the main process by design
        ".*is not resumable.*",  # the DataModule restores its sampler itself
        ".*Consider setting `persistent_workers=True`.*",
        ".*`isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*configure_optimizers` will be overridden by.*",  # --optimizer: attnx says what runs instead
        ".*Previous log files in this directory will be deleted.*",  # a resumed run's: attnx keeps them
    ):
        warnings.filterwarnings("ignore", message=message)


def main(argv: list[str] | None = None) -> int:
    """Run `attnx <fit|validate|test|predict> [options]`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from attnx.data.datamodule import TranslationDataModule

    subcommand = argv[0] if argv else ""
    if subcommand in SUBCOMMANDS and len(argv) == 1:
        raise ConfigError(
            f"attnx {subcommand} needs a config: attnx {subcommand} --config FILE_OR_NAME (`attnx configs` lists "
            f"the packaged ones, e.g. --config multi30k_cpu); `attnx {subcommand} --help` lists every option"
        )
    original = list(argv)  # as typed, for the resume hint
    argv = resolve_configs(argv)
    if subcommand in DECODING_COMMANDS:
        argv = checkpoint_override(argv)
    quiet_third_parties()
    from attnx.commands.usage import configure_parsing, help_formatter

    configure_parsing()  # option help from the dataclasses' attribute docstrings (model.transformer.*, ...)
    no_exit = {"exit_on_error": False, "formatter_class": help_formatter()}
    # until training begins there is nothing to save: a stop signal ends the command at once, with one line
    signals = StopSignals(stop_signals_before_training(), at_once=True, when="before training began")
    if subcommand == "fit":
        signals.install()
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
        from attnx.commands.usage import UsageError, one_line, suggest

        raise UsageError(suggest(one_line(str(err)), option_names())) from err
    except TrainingInterrupted as err:
        return interrupted(err, original)
    except StopRequested as err:
        if rank_zero_only.rank == 0:
            print(f"attnx {subcommand}: {err.message}", file=sys.stderr)
        return err.exit_status
    except SIGTERMException:  # Lightning's own handling: the signal came before training began
        print(
            f"attnx {subcommand}: interrupted by SIGTERM before training began; nothing was saved",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    finally:
        signals.restore()
    return 0


def stop_signals_before_training() -> tuple[int, ...]:
    """SIGTERM, SIGINT and SIGUSR1; under Slurm, SIGUSR1 is left to Lightning's `SLURMEnvironment` (its
    requeue signal)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    signums = stop_signals()
    return signums[:2] if SLURMEnvironment.detect() else signums


def option_names() -> list[str]:
    """Every `--section.key` a fit/test config accepts, for "did you mean" hints."""
    from attnx.commands.usage import option_names as keys
    from attnx.data.datamodule import TranslationDataModule

    names = [
        "--config",
        "--print_config",
        "--ckpt_path",
        "--init_from",
        "--seed_everything",
        "--torch_threads",
    ]
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
