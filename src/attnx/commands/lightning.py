"""Run `attnx fit | validate | test | predict`: the command line prepared for [AttnxCLI][attnx.commands.lightning_cli.AttnxCLI],
its refusals as one line with "did you mean", and a stopped run as its exit status and the command that
resumes it."""

from __future__ import annotations

import signal
import sys
from typing import Any

from jsonargparse import ArgumentError
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.commands.help import configure_parsing, help_formatter
from attnx.commands.lightning_argv import checkpoint_override, resolve_configs, resume_command
from attnx.commands.lightning_cli import DECODING_COMMANDS, AttnxCLI
from attnx.commands.lightning_console import one_line_warnings, quiet_third_parties
from attnx.commands.spellings import (
    alias_help,
    component_names,
    conflicting_values,
    lightning_aliases,
    with_aliases,
)
from attnx.commands.usage import option_names as keys
from attnx.commands.usage import refused_command_line
from attnx.data.datamodule import TranslationDataModule
from attnx.errors import UsageError, expected_error
from attnx.training.best import BestCheckpoint
from attnx.training.ema import WeightEMA
from attnx.training.evaluation import TranslationEvaluator
from attnx.training.lora import LowRankAdapters
from attnx.training.module import TranslationTask
from attnx.training.progress import ProgressLog
from attnx.training.stopping import StopRequested, StopSignals, TrainingInterrupted, stop_signals
from attnx.training.throughput import TokenThroughput

SUBCOMMANDS = ("fit", *DECODING_COMMANDS)


def main(argv: list[str] | None = None) -> int:
    """Run `attnx <fit|validate|test|predict> [options]`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    subcommand = argv[0] if argv else ""
    if subcommand in SUBCOMMANDS and len(argv) == 1:
        raise UsageError(
            f"attnx {subcommand} needs a config: attnx {subcommand} --config FILE_OR_NAME (`attnx configs` lists "
            f"the packaged ones, e.g. --config multi30k_cpu); `attnx {subcommand} --help` lists every option"
        )
    original = list(argv)  # as typed, for the resume hint
    argv = component_names(resolve_configs(argv))
    short = lightning_aliases() if subcommand in DECODING_COMMANDS else {}
    conflicting_values(argv, short)
    if subcommand in DECODING_COMMANDS:
        argv = checkpoint_override(with_aliases(argv, short))
    quiet_third_parties()
    one_line_warnings()
    configure_parsing()  # option help from the dataclasses' attribute docstrings (model.transformer.*, ...)
    # an abbreviation (`--trainer.max_step`) is refused with "did you mean", never taken as a prefix of an option
    no_exit = {"exit_on_error": False, "allow_abbrev": False, "formatter_class": help_formatter()}
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
            parser_kwargs={
                "prog": "attnx",
                **no_exit,
                **{name: subcommand_parser(name, no_exit) for name in SUBCOMMANDS},
            },
            # test and predict count sentences on their own line (TranslationEvaluator), not batches on a bar
            trainer_defaults={
                "enable_progress_bar": sys.stderr.isatty() and subcommand not in ("test", "predict")
            },
        )
    except ArgumentError as err:
        if expected_error(err) is not None:  # a setting refused its value: `attnx` reports that error
            raise
        raise refused_command_line(err, argv, [*option_names(), *short]) from err
    except TrainingInterrupted as err:
        return interrupted(err, original)
    except StopRequested as err:
        if rank_zero_only.rank == 0:
            print(f"attnx {subcommand}: {err.message}", file=sys.stderr)
        return err.exit_status
    except SIGTERMException:  # Lightning's own handling: before training began, or while decoding (test...)
        when = "before training began" if subcommand == "fit" else f"before {subcommand} ended"
        print(
            f"attnx {subcommand}: interrupted by SIGTERM {when}; nothing was saved: run the same command again",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    finally:
        signals.restore()
        end_process_group()
    return 0


def end_process_group() -> None:
    """Destroy the process group a distributed run made, on every rank, before the interpreter exits: Lightning
    does so for NCCL alone, and a gloo group left to the interpreter's end can abort the process ("terminate
    called without an active exception", SIGABRT) while its worker threads still hold tensors."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def subcommand_parser(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The parser settings of subcommand `name`: those of every parser, and for a decoding command the short
    spellings of its search options at the end of its `--help`."""
    short = alias_help(lightning_aliases()) if name in DECODING_COMMANDS else None
    return {**settings, "epilog": short} if short else dict(settings)


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


def stop_signals_before_training() -> tuple[int, ...]:
    """SIGTERM, SIGINT and SIGUSR1; under Slurm, SIGUSR1 is left to Lightning's `SLURMEnvironment` (its
    requeue signal)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    signums = stop_signals()
    return signums[:2] if SLURMEnvironment.detect() else signums


def option_names() -> list[str]:
    """Every `--section.key` a fit/test config accepts, for "did you mean" hints; an option whose value is a
    class (`--optimizer`, `--trainer.logger`) stands for every key below it."""
    names = [
        "--config",
        "--print_config",
        "--help",
        "--ckpt_path",
        "--init_from",
        "--run_dir",
        "--name",
        "--seed_everything",
        "--torch_threads",
        "--cuda_graphs",
        "--optimizer",
        "--lr_scheduler",
    ]
    for prefix, target in {
        "trainer": Trainer.__init__,
        "model": TranslationTask.__init__,  # with model.transformer.* and model.loss.*
        "data": TranslationDataModule.__init__,
        "evaluation": TranslationEvaluator.__init__,  # with evaluation.search.*
        "progress": ProgressLog.__init__,
        "throughput": TokenThroughput.__init__,
        "best": BestCheckpoint.__init__,
        "ema": WeightEMA.__init__,
        "lora": LowRankAdapters.__init__,
    }.items():
        names += keys(target, prefix)
    return names
