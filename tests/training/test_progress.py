"""The console lines of a run: one per validation with ETA, periodic ones without a progress bar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from attnx.training.progress import ProgressLog, TrainingProgressBar, epoch_label, run_eta
from tests.training.conftest import fit_args


def trainer(step: int, max_steps: int = 100, **metrics: float) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step,
        max_steps=max_steps,
        callback_metrics={k.replace("__", "/"): torch.tensor(v) for k, v in metrics.items()},
        callbacks=[],
        progress_bar_callback=None,
        sanity_checking=False,
        state=SimpleNamespace(fn="fit"),
        log_dir="runs/x/version_0",
        default_root_dir=".",
        global_rank=0,
    )


def test_validation_line_has_step_metrics_speed_and_eta(capsys) -> None:
    log = ProgressLog(every_n_steps=10)
    log.on_fit_start(None, None)
    log._start -= 100.0  # 100 s of training so far
    run = trainer(
        25,
        val__loss=3.4123,
        val__ppl=22.14,
        val__bleu=18.634,
        train__tokens_per_s=7930.4,
        train__tgt_tokens_per_s=3981.2,
    )
    log.on_validation_end(run, None)
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        "step 25/100 | val loss 3.412 ppl 22.14 bleu 18.63 | 7,930 tok/s src+tgt, 3,981 tgt | 0:01:40 elapsed"
    )
    assert line.endswith("ETA 0:05:00")  # 75 steps left at 4 s each


def test_training_lines_every_n_steps_once(capsys) -> None:
    log = ProgressLog(every_n_steps=10)
    log.on_fit_start(None, None)
    for step in (9, 10, 10, 11, 20):
        log.on_train_batch_end(trainer(step, **{"train__loss": 4.5, "train__lr": 1e-3}), None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" |")[0] for line in lines] == ["step 10/100", "step 20/100"]
    assert "train loss 4.500 | lr 1.00e-03" in lines[0]


def test_first_training_line_comes_after_the_first_step(capsys) -> None:
    """A step of a big model on CPU takes minutes: the first line must not wait `every_n_steps` of them."""
    log = ProgressLog(every_n_steps=100)
    log.on_fit_start(None, None)
    for step in (0, 1, 1, 2, 99, 100):  # 0: accumulating the first step's batches
        log.on_train_batch_end(trainer(step, max_steps=1000, train__loss=4.5), None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" |")[0] for line in lines] == ["step 1/1000", "step 100/1000"]


def test_a_slow_run_gets_a_line_every_minute_and_a_resumed_one_after_its_first_step(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1 and then 5:48 of silence until step 100 in a log file; a resumed segment silent for minutes."""
    import attnx.training.progress as progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = ProgressLog(every_n_steps=100, every_seconds=60)
    log.on_fit_start(None, None)
    log.on_train_start(trainer(146, max_steps=1000), None)  # resumed at step 146
    for step in range(147, 201):
        clock[0] += 3.5  # seconds a step
        log.on_train_batch_end(trainer(step, max_steps=1000, train__loss=4.5), None)
    lines = capsys.readouterr().out.strip().splitlines()
    steps = [line.split(" |")[0] for line in lines]
    assert steps == ["step 147/1000", "step 165/1000", "step 183/1000", "step 200/1000"]


def test_progress_bar_numbers_show_the_learning_rate_and_the_run_eta() -> None:
    """Lightning's bar showed `lr 0.000` for a whole run (its `.3f`) and counted its time down per epoch."""
    bar = TrainingProgressBar()
    bar._start -= 100.0  # 100 s of training so far
    bar.update_status(
        trainer(25, max_steps=100, train__loss=4.5, train__lr=0.0018, train__tokens_per_s=7930.4)
    )
    assert bar.status.text == "ETA 0:05:00 · loss 4.500 · lr 1.8e-03 · tok/s 7,930"  # 75 steps left at 4 s
    assert bar.get_metrics(None, None) == {}  # Lightning's own metrics column stays empty


def test_progress_bar_label_for_runs_bounded_by_epochs_steps_or_neither() -> None:
    assert epoch_label(3, 10, 120, -1) == "Epoch 3/9"
    assert epoch_label(3, -1, 1200, 100000) == "Epoch 3, step 1200/100000"
    assert epoch_label(3, None, 1200, -1) == "Epoch 3"


def test_progress_bar_of_a_run_bounded_by_steps_shows_the_steps(corpus: Path, tmp_path: Path) -> None:
    """Lightning's Rich bar read `Epoch 0/-2` when max_epochs is -1 (Rich prints its last frame to a pipe).

    Without Rich (it comes with the dev extras) Lightning draws its tqdm bar, labelled `Epoch 0`.
    """
    pytest.importorskip("rich")
    argv = [sys.executable, "-m", "attnx"]
    argv += fit_args(corpus, "--trainer.max_steps", "4", "--trainer.max_epochs", "-1")
    done = subprocess.run(
        [*argv, "--trainer.enable_progress_bar", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Epoch 0, step 4/4" in done.stdout and "/-2" not in done.stdout, done.stdout[-2000:]
    # at 80 columns the bar stays one line (Lightning's metrics column wrapped one word per line)
    bar = [line for line in done.stdout.splitlines() if line.startswith("Epoch 0, step 4/4")]
    assert len(bar) == 1 and len(bar[0].rstrip()) <= 80 and "ETA " in bar[0], done.stdout[-2000:]
    after = done.stdout.split(bar[0], 1)[1].strip()
    assert after == "", f"the bar wrapped: {after!r}"


def test_a_resumed_runs_eta_counts_only_the_steps_it_took_itself(capsys) -> None:
    """Resumed at step 300 of 600, 100 steps in 100 s: 200 s left. Counting the checkpoint's 300 steps as done in
    those 100 s said 0:00:50."""
    log = ProgressLog(every_n_steps=100)
    log.on_fit_start(None, None)
    log.on_train_start(trainer(300, max_steps=600), None)
    log._start -= 100.0  # 100 s of this process's training
    log.on_train_batch_end(trainer(400, max_steps=600, train__loss=4.5), None)
    assert capsys.readouterr().out.strip().endswith("elapsed, ETA 0:03:20")
    assert run_eta(trainer(400, max_steps=600), 100.0, first_step=300) == "0:03:20"


class Counted(pl.LightningModule):
    """A one-weight model that notes the optimizer step of each validation of fit (not of the sanity check);
    each training step moves `clock` on by a minute."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.weight = torch.nn.Linear(2, 1)
        self.validated: list[int] = []
        self.clock = clock

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.clock[0] += 60.0
        return self.weight(batch[0]).sum()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        if not self.trainer.sanity_checking and self.global_step not in self.validated:
            self.validated.append(self.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


EPOCH = 16
"""Training batches of an epoch of `run_validations`' data: 64 rows, 4 a batch."""


def run_validations(
    tmp_path: Path, resume: Path | None = None, clock: list[float] | None = None, **options
) -> tuple[pl.Trainer, list[int]]:
    """A real Lightning fit of `Counted` under trainer `options`: the trainer and the steps it validated at."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(EPOCH * 4, 2))
    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    trainer = pl.Trainer(
        default_root_dir=tmp_path, num_sanity_val_steps=0, enable_checkpointing=False, **quiet, **options
    )
    model = Counted([0.0] if clock is None else clock)
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=64), ckpt_path=resume)
    return trainer, model.validated


@pytest.mark.parametrize(
    "options",
    [
        {"max_steps": 10, "val_check_interval": 100, "check_val_every_n_epoch": None},
        {
            "max_steps": 10,
            "val_check_interval": 4,
            "check_val_every_n_epoch": None,
            "accumulate_grad_batches": 2,
        },
        {"max_steps": 10, "val_check_interval": 1.0, "check_val_every_n_epoch": 1},  # the epoch is 16 batches
        {"max_steps": 20, "val_check_interval": 0.5, "check_val_every_n_epoch": 1},
        {"max_steps": 20, "val_check_interval": 1.0, "check_val_every_n_epoch": 2},
        {"max_steps": 40, "val_check_interval": 1.0, "check_val_every_n_epoch": 2},
        {"max_steps": 20, "val_check_interval": 5, "check_val_every_n_epoch": 2},
        {"max_steps": 4, "val_check_interval": 1.0, "check_val_every_n_epoch": 1, "limit_train_batches": 5},
        {"max_steps": 20, "val_check_interval": 1.0, "check_val_every_n_epoch": 1, "limit_train_batches": 5},
        {"max_steps": 20, "val_check_interval": 8, "check_val_every_n_epoch": None, "limit_train_batches": 5},
        {
            "max_steps": 20,
            "val_check_interval": 0.5,
            "check_val_every_n_epoch": 1,
            "limit_train_batches": 0.5,
        },
        {"max_steps": 10, "val_check_interval": 100, "check_val_every_n_epoch": None, "limit_val_batches": 0},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items() if k != "check_val_every_n_epoch"),
)
def test_no_validation_is_said_exactly_of_the_runs_lightning_does_not_validate(
    options: dict, tmp_path: Path
) -> None:
    """Fraction or count of batches, every n-th epoch, shorter epochs (limit_train_batches), accumulation:
    the line comes where Lightning's own fit validates never, and only there."""
    from attnx.training.progress import no_validation_line

    trainer, validated = run_validations(tmp_path, **options)
    line = no_validation_line(trainer, options["max_steps"], epoch_batches=EPOCH)
    assert (line is not None) == (validated == []), (line, validated)
    if line and options.get("limit_val_batches") == 0:
        assert line == "no validation in this run: trainer.limit_val_batches is 0"
    elif line:
        assert line.startswith(
            f"no validation in this run: it ends after about {trainer.global_step:,} batches"
        )
    if options["check_val_every_n_epoch"] is not None:  # without the epoch's length: nothing said
        assert no_validation_line(trainer, options["max_steps"]) is None


def test_a_run_that_max_time_stops_validates_once_and_says_so(tmp_path: Path, monkeypatch) -> None:
    """Lightning validates a run told to stop: "no validation in this run" was printed for it, when its max_time
    ends it before its first val_check_interval. A step takes a minute of the Timer's clock here: 5 minutes, 5
    steps."""
    from lightning.pytorch.callbacks import timer

    from attnx.training.progress import no_validation_line

    clock = [0.0]
    monkeypatch.setattr(timer, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    options = {
        "max_steps": -1,
        "max_epochs": 1,  # a bound, should the Timer not stop it
        "max_time": {"minutes": 5},
        "val_check_interval": 1000,
        "check_val_every_n_epoch": None,
    }
    trainer, validated = run_validations(tmp_path, clock=clock, **options)
    assert validated == [trainer.global_step] == [5]  # stopped after its fifth step, and validated there
    assert no_validation_line(trainer, 5) == (
        "one validation in this run, when trainer.max_time stops it after about 5 batches: its first by "
        "trainer.val_check_interval would come at batch 1,000; --trainer.val_check_interval 1 validates about 4 "
        "times"
    )
    clock[0] = 0.0
    trainer, validated = run_validations(tmp_path, clock=clock, **(options | {"max_steps": 4}))
    assert validated == []  # max_steps ended it first: no validation at all
    assert no_validation_line(trainer, 4).startswith(
        "no validation in this run: it ends after about 4 batches"
    )


def test_a_resumed_run_counts_its_validations_from_where_it_resumed(tmp_path: Path) -> None:
    """Resumed at step 9 of 12 (validated at 8), validating every 8 batches: none in the rest of the run; resumed at
    step 6 of 12, one at 8."""
    from attnx.training.progress import no_validation_line

    every = {"val_check_interval": 8, "check_val_every_n_epoch": None}
    for resumed_at, validations in ((9, []), (6, [8])):
        first, _ = run_validations(tmp_path, max_steps=resumed_at, **every)
        first.save_checkpoint(checkpoint := tmp_path / f"step={resumed_at}.ckpt")
        trainer, validated = run_validations(tmp_path, resume=checkpoint, max_steps=12, **every)
        assert validated == validations
        line = no_validation_line(trainer, 12, first_step=resumed_at)
        assert (line is not None) == (validated == [])
    assert line is None
    assert no_validation_line(trainer, 12, first_step=9) == (
        "no validation in the rest of this run: it ends after about 12 batches, before its next validation at 16 "
        "(trainer.val_check_interval); --trainer.val_check_interval 1 validates about 4 times"
    )
    assert no_validation_line(trainer, 12) is None  # from the start: the validation at 8


def test_validation_by_time_is_not_told_before_training() -> None:
    from attnx.training.progress import next_validation

    clock = SimpleNamespace(val_check_interval="00:00:10:00", check_val_every_n_epoch=None)
    assert next_validation(clock, 0) is None
