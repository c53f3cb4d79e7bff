"""`attnx fit | validate | test | predict --config FILE`: LightningCLI over TranslationTask and the data.

Everything a run needs is in its config (`--print_config` shows all of it; any key can be overridden on the
command line, e.g. `--trainer.max_steps 1000`) and the full config is saved beside every run as
`config.yaml`. `--config` takes a file or the name of a packaged config (`attnx configs` lists them).
The vocabulary size is linked from the data to `model.transformer.vocab_size`. The `evaluation` section
configures decoding and BLEU ([TranslationEvaluator][attnx.training.evaluation.TranslationEvaluator]); the
`progress` section the console lines ([ProgressLog][attnx.training.progress.ProgressLog]); the `best` section
`best.ckpt` and early stopping ([BestCheckpoint][attnx.training.best.BestCheckpoint]). Checkpoints are
written atomically and read with `weights_only=True`.

A run is one folder across its restarts ([attnx.training.runs][]): `--ckpt_path CKPT` resumes the run CKPT
belongs to, in its folder, applying the options a run may change (one line each) and refusing the others;
`--init_from CKPT` starts a new run from CKPT's weights with a fresh optimizer, schedule and step count
([attnx.training.resume][]). `--run_dir DIR` (or `--name NAME`, `<save_dir>/NAME`) chooses a new run's folder;
`validate`, `test` and `predict` log inside the run their checkpoint lies in ([attnx.training.run_dir][]).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch
import torch
import yaml
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from attnx.checkpoint import read_checkpoint
from attnx.commands.ckpt_path import averaged_example, checked_checkpoint
from attnx.commands.devices import check_devices
from attnx.commands.lightning_console import with_progress_bar
from attnx.commands.usage import config_file_action
from attnx.errors import ConfigError
from attnx.training.best import BestCheckpoint
from attnx.training.captured_steps import CapturedSteps, capture_plan
from attnx.training.checkpointing import AtomicCheckpointIO
from attnx.training.corpus_mix import CorpusMixLog
from attnx.training.ema import WeightEMA
from attnx.training.evaluation import TranslationEvaluator
from attnx.training.fit_estimate import fit_estimate_lines
from attnx.training.lora import LowRankAdapters, random_weights_line
from attnx.training.optimizers import SCHEDULER_NEEDS_OPTIMIZER, choice_line, configure_optimizers
from attnx.training.precision import emulated_bf16_line, resolve_cpu_precision
from attnx.training.progress import ProgressLog
from attnx.training.resume import check_init_from, continue_run, load_initial_weights
from attnx.training.run_dir import chosen_folder, evaluation_folder, has_loggers, place_loggers, refuse_taken
from attnx.training.runs import Resumed, RunFolder, pin_versions, resumed_run
from attnx.training.throughput import TokenThroughput

DECODING_COMMANDS = ("validate", "test", "predict")
"""The commands that decode with the weights of `--ckpt_path`."""


class AttnxCLI(LightningCLI):
    """LightningCLI with attnx's links, checks, callbacks and checkpoint handling."""

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, with a `--config` that names the file and the meant key of a misspelt one."""
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
        parser.add_lightning_class_args(BestCheckpoint, "best")
        parser.add_lightning_class_args(WeightEMA, "ema")
        parser.add_lightning_class_args(LowRankAdapters, "lora")
        parser.add_argument(
            "--torch_threads",
            type=int | None,
            default=None,
            help="CPU threads for PyTorch's kernels (torch.set_num_threads); None keeps PyTorch's default "
            "(one per core). On a CPU shared with other jobs, fewer threads than cores avoids stalls.",
        )
        parser.add_argument(
            "--cuda_graphs",
            type=bool | None,
            default=None,
            help="fit: capture each training batch shape's forward and backward once as a CUDA graph and replay "
            "it (one launch instead of hundreds: the GPU no longer waits for the host at small batches). None "
            "(default): on a CUDA device where batches come in shape buckets (data.shape_buckets); true: on a "
            "CUDA device whatever the buckets; false: never. The first lines of fit say how many shapes were "
            "captured, their memory and the time it took. Under DDP only the batches that do not all-reduce "
            "(all but the last of each accumulation window) replay. On a CPU it does nothing.",
        )
        parser.add_argument(
            "--init_from",
            type=str | None,
            default=None,
            help="fit: start a new run from this checkpoint's weights, with a fresh optimizer, schedule and step "
            "count (fine-tuning, domain adaptation, the second stage of back-translation); the config's model "
            "must have the checkpoint's architecture. --ckpt_path instead resumes the checkpoint's run.",
        )
        parser.add_argument(
            "--run_dir",
            type=str | None,
            default=None,
            help="fit: the folder the run writes, exactly (fairseq's --save-dir, Marian's -m): its checkpoints/, "
            "metrics.csv, config.yaml, hparams.yaml and TensorBoard events, for every logger of the config, "
            "instead of <save_dir>/<name>/version_N. A folder that holds a run already is refused unless "
            "--ckpt_path resumes that run (--ckpt_path last and best are looked up in it); a resumed run "
            "continues in its own folder without it. validate/test/predict: the run whose --ckpt_path last or "
            "best to decode (they log in the run their checkpoint lies in, RUN/test/<checkpoint name>/).",
        )
        parser.add_argument(
            "--name",
            type=str | None,
            default=None,
            help="Short for --run_dir <the loggers' save_dir>/NAME (e.g. runs/NAME), with no version_N: "
            "attnx fit --init_from parent.ckpt --name lora_medical writes runs/lora_medical.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        self.resumed: Resumed | None = None
        self.run_config = ""
        self.run_dir: Path | None = None
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        self.run_dir = chosen_folder(config.get("run_dir"), config.get("name"), config.get("trainer") or {})
        self.run_option = (
            f"--run_dir {config['run_dir']}" if config.get("run_dir") else f"--name {config.get('name')}"
        )
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
        config["ckpt_path"] = checked_checkpoint(
            subcommand, config.get("ckpt_path"), config.get("trainer"), self.run_dir
        )
        if subcommand != "fit":
            ckpt_path = config.get("ckpt_path")
            if ckpt_path and Path(ckpt_path).is_file():  # its run folder only: the weights load later
                try:
                    stored = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError:  # a file torch cannot map (written before torch 1.6): its path says
                    stored = {}
                self.resumed = resumed_run(ckpt_path, stored)
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
        if subcommand in DECODING_COMMANDS and not config.get("ckpt_path"):
            raise ConfigError(
                f"attnx {subcommand} needs weights: pass --ckpt_path CHECKPOINT (e.g. "
                f"{averaged_example(config.get('trainer') or {}, self.run_dir)}), or set ckpt_path in the config; "
                "without it the model would be randomly initialised"
            )
        if subcommand == "fit":
            if self.resumed is not None:  # the command line's and config's model, not the checkpoint's
                config["model"] = self.typed_model
            self._place_run(config.get("trainer") or {})
            self.continued = continue_run(config.get("trainer") or {}, self.resumed, self.typed)
        elif subcommand:
            self._place_evaluation(config.get("trainer") or {}, subcommand)
        trainer = config.get("trainer") or {}
        check_devices(trainer)
        resumed_in = self.resumed.log_dir if self.resumed is not None else None
        if subcommand == "fit" and (choice := resolve_cpu_precision(trainer, resumed_in)):
            print(choice.line(), flush=True)  # trainer.precision unset: chosen from the CPU's bf16 units
        elif subcommand == "fit" and (slow := emulated_bf16_line(trainer)) and rank_zero_only.rank == 0:
            print(f"attnx fit: warning: {slow}", file=sys.stderr, flush=True)
        if subcommand == "fit" and config.get("lr_scheduler") and not config.get("optimizer"):
            raise ConfigError(SCHEDULER_NEEDS_OPTIMIZER)  # LightningCLI would drop it without a word
        if subcommand == "fit" and config.get("optimizer"):
            print(choice_line(config["optimizer"], config.get("lr_scheduler"), config["model"]), flush=True)
        threads = config.get("torch_threads")
        if threads:
            torch.set_num_threads(threads)

    def _place_run(self, trainer: Any) -> None:
        """fit: the run's folder where the command chose it (`--run_dir`, `--name`), or where the resumed run's was
        chosen; a folder holding another run is refused in one line."""
        folder, option, resumed = self.run_dir, self.run_option, self.resumed
        resumes = resumed is not None and resumed.log_dir is not None and resumed.log_dir.is_dir()
        if folder is None and resumes and any((resumed.config or {}).get(key) for key in ("run_dir", "name")):
            folder, option = resumed.log_dir, f"--ckpt_path {resumed.checkpoint}"  # it continues there
        if folder is None:
            return
        if not has_loggers(trainer):
            raise ConfigError(
                f"{option}: the config leaves trainer.logger to Lightning's default, which numbers its own "
                "version_N folders; name the loggers (e.g. lightning.pytorch.loggers.CSVLogger with a save_dir), "
                "or set trainer.logger false"
            )
        if rank_zero_only.rank == 0:  # the others may start once rank 0 has begun writing the folder (DDP)
            refuse_taken(folder, option, resumes and resumed.log_dir.resolve() == folder.resolve())
        place_loggers(trainer, folder)

    def _place_evaluation(self, trainer: Any, subcommand: str) -> None:
        """validate/test/predict: log in the run the checkpoint lies in, or in a folder beside a checkpoint of no
        run, never in a new `version_N`; said in one line."""
        if self.resumed is None:  # a checkpoint Lightning resolves itself (`hpc`, `registry`)
            pin_versions(trainer, None, None)
            return
        checkpoint = self.resumed.checkpoint
        folder, run = evaluation_folder(checkpoint, trainer, subcommand)
        if self.run_dir is not None and (run is None or run.resolve() != self.run_dir.resolve()):
            raise ConfigError(
                f"{self.run_option}: --ckpt_path {checkpoint} is not a checkpoint of the run in {self.run_dir} "
                f"(attnx {subcommand} logs in the run its checkpoint lies in); pass --ckpt_path last, best or a file "
                f"of {self.run_dir / 'checkpoints'}, or leave {self.run_option.split()[0]} out"
            )
        if rank_zero_only.rank == 0:
            whose = f"belongs to the run {run}" if run is not None else "lies in no run's checkpoints/ folder"
            print(f"attnx {subcommand}: {checkpoint} {whose}; this {subcommand} logs in {folder}", flush=True)

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
        if callbacks is None:
            callbacks = (init.get("trainer") or {}).get("callbacks") or []
            callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        # also where a checkpoint's entries are only restored (validate, test, predict): Lightning asks for the
        # callback of every state a checkpoint holds, and RunFolder and CorpusMixLog do nothing else there
        callbacks.append(
            RunFolder(self.run_config, self.resumed if subcommand == "fit" else None, self.continued)
        )
        if subcommand == "fit":
            callbacks.append(CapturedSteps(self.config["fit"].get("cuda_graphs")))
        # logs only in fit, where data.corpus_weights/sampling_temperature mix
        callbacks.append(CorpusMixLog())
        kwargs["callbacks"] = callbacks
        return super().instantiate_trainer(plugins=plugins, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """LightningCLI's subcommands; `test` without `--verbose`, Lightning's table of the logged metrics:
        `attnx test` prints its scores once, in its own lines ([test][attnx.commands.lightning_cli.AttnxCLI.test])."""
        commands = LightningCLI.subcommands()
        commands["test"] = {*commands["test"], "verbose"}
        return commands

    def test(self, **kwargs: Any) -> None:
        """`trainer.test` without Lightning's table, which repeated the BLEU and chrF the evaluator prints (with
        their signatures); the loss and perplexity it also held follow them in one line (`after_test`)."""
        self.trainer.test(**kwargs, verbose=False)

    def after_test(self) -> None:
        metrics = self.trainer.callback_metrics
        if rank_zero_only.rank == 0 and "test/loss" in metrics:
            print(
                f"test loss {float(metrics['test/loss']):.4f} (label-smoothed), nll {float(metrics['test/nll']):.4f}, "
                f"perplexity {float(metrics['test/ppl']):.2f} per target token",
                flush=True,
            )
        self._say_written()

    def after_predict(self) -> None:
        self._say_written()

    def _say_written(self) -> None:
        """The file of translations, as the command's last line (after the scores and Lightning's table)."""
        for callback in self.trainer.callbacks:
            if isinstance(callback, TranslationEvaluator) and callback.written is not None:
                print(f"translations written to {callback.written}", flush=True)

    def before_fit(self) -> None:
        if rank_zero_only.rank == 0:  # the plan before the hardware: memory and time, estimated
            enabled = self.config["fit"].get("cuda_graphs")
            captured, _ = capture_plan(enabled, self.trainer, self.model, self.datamodule)
            resumed = self.resumed
            for line in fit_estimate_lines(
                self.trainer,
                self.model,
                self.datamodule,
                captured=captured,
                resumed_step=resumed.step if resumed else 0,
                trained_seconds=resumed.trained_seconds if resumed else 0.0,
            ):
                print(line, flush=True)
        for callback in self.trainer.callbacks:
            if isinstance(callback, RunFolder):
                callback.before_fit(self.trainer)
        fit = self.config["fit"]
        init_from = fit.get("init_from")
        if init_from:
            load_initial_weights(self.model, init_from, self.datamodule.tokenizer)
        untrained = random_weights_line(fit.get("lora.rank"), init_from, fit.get("ckpt_path"))
        if untrained and rank_zero_only.rank == 0:
            print(f"attnx fit: warning: {untrained}", file=sys.stderr, flush=True)
