"""TranslationTask: training steps through the real CLI and Trainer (schedule, precision, divergence), and in
each precision on a repeated batch: finite losses that fall, then beam search (beam 4) with the trained weights
on the same device. The CUDA tests are the first thing to run on a GPU."""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from attnx.cli import main as attnx
from attnx.data.batch import BOS_ID, PAD_ID, Batch, collate
from attnx.data.batching import no_collate
from attnx.inference.config import SearchConfig
from attnx.inference.lengths import max_output_lengths
from attnx.inference.search import translate_batch
from attnx.training.module import TranslationTask
from attnx.training.schedule import inverse_sqrt_schedule
from tests.conftest import tiny_config
from tests.training.conftest import fit_args, read_metrics, train_losses

QUICK = [
    "--trainer.callbacks",
    "null",
    "--evaluation.bleu_samples",
    "0",
    "--trainer.enable_checkpointing",
    "false",
]


def fit(corpus: Path, work: Path, *extra: str) -> tuple[int, Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        rc = attnx(fit_args(corpus, *QUICK, *extra))
    return rc, work / "runs" / "tiny" / "version_0"


def test_gradient_accumulation_steps_the_schedule_once_per_update(corpus: Path, tmp_path: Path) -> None:
    rc, run = fit(corpus, tmp_path, "--trainer.max_steps", "5", "--trainer.accumulate_grad_batches", "2")
    assert rc == 0
    rates = {int(r["step"]): float(r["train/lr"]) for r in read_metrics(run) if r["train/lr"]}
    # 10 batches, 5 updates; update n (logged at step n - 1) uses Eq. 3 at n: d_model 32, warmup 4
    assert rates == pytest.approx({n - 1: inverse_sqrt_schedule(n, 32, 4) for n in range(1, 6)})


def test_bf16_mixed_trains_on_cpu(corpus: Path, tmp_path: Path) -> None:
    rc, run = fit(corpus, tmp_path, "--trainer.max_steps", "3", "--trainer.precision", "bf16-mixed")
    assert rc == 0
    losses = train_losses(run)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses.values())


def test_diverging_run_stops_with_the_step_and_advice(corpus: Path, tmp_path: Path, capsys) -> None:
    rc, _ = fit(corpus, tmp_path, "--trainer.max_steps", "4", "--model.lr_factor", "1e30")
    err = capsys.readouterr().err
    assert rc == 1
    assert "training loss is nan at optimizer step 2" in err
    assert "Lower model.lr_factor" in err and "32-true" in err


def test_hyperparameters_are_plain_without_the_cli(corpus: Path) -> None:
    from attnx.model import TransformerConfig
    from attnx.training.module import TranslationTask

    task = TranslationTask(TransformerConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32))
    assert isinstance(task.hparams["transformer"], dict) and isinstance(task.hparams["loss"], dict)
    restored = TranslationTask(**{k: v for k, v in task.hparams.items()})
    assert restored.config == task.config
    torch.testing.assert_close(torch.tensor(restored.hparams["betas"]), torch.tensor(task.hparams["betas"]))


STEPS = 20
VOCAB = 64
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def repeated_batch() -> Batch:
    """Twelve pairs of 3-17 tokens (so both sides are padded), fixed by a seed."""
    gen = torch.Generator().manual_seed(7)
    pairs = []
    for _ in range(12):
        n = int(torch.randint(3, 18, (1,), generator=gen))
        src = torch.randint(4, VOCAB, (n,), generator=gen).tolist()
        pairs.append((src, [(x * 7 + 3) % (VOCAB - 4) + 4 for x in reversed(src)]))  # a learnable mapping
    return collate(pairs, index=list(range(12)))


class LossLog(pl.Callback):
    """Each step's loss and the device its weights were on (Lightning moves them back to the CPU at the end)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.devices: set[str] = set()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        self.devices.add(next(module.parameters()).device.type)


def train(
    accelerator: str, precision: str, lr_factor: float = 0.25, warmup_steps: int = 4
) -> tuple[LossLog, TranslationTask]:
    """``STEPS`` optimizer steps of a 2+2-layer d_model 64 model on one batch, through ``Trainer.fit``."""
    pl.seed_everything(0, verbose=False)
    config = tiny_config(vocab_size=VOCAB, d_model=64, n_heads=4, d_ff=128, dropout=0.1)
    task = TranslationTask(
        transformer=config, label_smoothing=0.1, lr_factor=lr_factor, warmup_steps=warmup_steps
    )
    batch = repeated_batch()
    log = LossLog()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[log],
    )
    loader = DataLoader([batch] * STEPS, batch_size=None, collate_fn=no_collate)
    trainer.fit(task, train_dataloaders=loader)
    return log, task


def check_training(losses: list[float]) -> None:
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.85 * first, losses


def check_beam_search(task: TranslationTask, device: str, autocast: torch.dtype | None) -> None:
    batch = repeated_batch().to(device)
    model = task.model.to(device)
    config = SearchConfig(beam=4, max_positions=task.config.max_len)  # §6.1: α 0.6, input length + 50
    with torch.autocast(device, dtype=autocast or torch.float32, enabled=autocast is not None):
        hypotheses = translate_batch(model, batch.src, batch.src_mask, config)
    limits = max_output_lengths(batch.src_mask, config.max_len_a, config.max_len_b, config.max_positions)
    assert len(hypotheses) == batch.size
    for hyp, limit in zip(hypotheses, limits.tolist(), strict=True):
        assert len(hyp) <= limit and all(0 <= t < VOCAB for t in hyp)
        assert PAD_ID not in hyp and BOS_ID not in hyp


def test_trains_and_decodes_on_cpu_in_fp32() -> None:
    log, task = train("cpu", "32-true")
    check_training(log.losses)
    assert log.devices == {"cpu"}
    check_beam_search(task, "cpu", None)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_trains_and_decodes_on_cuda_in_mixed_precision(precision: str) -> None:
    """bf16 autocast, or fp16 autocast with dynamic loss scaling (Lightning's GradScaler)."""
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    log, task = train("gpu", precision)
    check_training(log.losses)
    assert log.devices == {"cuda"}  # every step ran there
    check_beam_search(task, "cuda", torch.bfloat16 if precision == "bf16-mixed" else torch.float16)


def test_a_checkpoint_differing_only_in_dropout_loads() -> None:
    """Dropout may change when a run resumes; the architecture may not (test_checkpointing's refusal)."""
    ours = TranslationTask(tiny_config(vocab_size=300, dropout=0.3))
    theirs = tiny_config(vocab_size=300, dropout=0.1).to_dict()
    ours.on_load_checkpoint({"attnx": {"transformer": theirs}, "state_dict": {}})
    assert ours.config.dropout == 0.3  # the run's new value stays


# --- the tokenizer is part of the model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another slice of Multi30k with its own 300-piece SentencePiece model: the same size as the `corpus`
    fixture's, other pieces."""
    import gzip

    root = tmp_path_factory.mktemp("other_slice")
    for split, lang in [(s, lang) for s in ("train", "val", "test_2016_flickr") for lang in ("en", "de")]:
        with gzip.open(shared_data / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()[1000:1400] if split == "train" else f.read().splitlines()[:50]
        (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = root / "prepared"
    argv = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--vocab_size", "300", "--workers", "1"]
    argv += [
        "--train",
        str(root / "train"),
        "--valid",
        str(root / "val"),
        "--test",
        str(root / "test_2016_flickr"),
    ]
    assert attnx([*argv, "--output", str(out)]) == 0
    return out


@pytest.mark.slow
def test_a_checkpoint_refuses_another_sentencepiece_model(
    corpus: Path, other_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`attnx test` and `attnx fit --ckpt_path` on a corpus whose SentencePiece model is not the checkpoint's
    (same size, other pieces): one line naming both files, the first difference and the way out. A checkpoint
    written before the hash was recorded is checked by the model it carries."""
    import subprocess
    import sys

    from attnx.checkpoint import read_checkpoint
    from attnx.data.tokenizer import Tokenizer

    ours, theirs = Tokenizer.load(corpus / "spm.model"), Tokenizer.load(other_corpus / "spm.model")
    assert ours.vocab_size == theirs.vocab_size and ours.sha256 != theirs.sha256
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert attnx(fit_args(corpus, "--trainer.max_steps", "2", "--evaluation.bleu_samples", "0")) == 0
    run = tmp_path / "runs" / "tiny" / "version_0"
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert read_checkpoint(checkpoint)["attnx"]["tokenizer_sha256"] == ours.sha256

    command = [
        sys.executable,
        "-m",
        "attnx",
        *fit_args(other_corpus, "--ckpt_path", str(checkpoint), subcommand="test"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"attnx test: error: checkpoint {checkpoint} was trained with another SentencePiece "
                           f"model than {other_corpus / 'spm.model'}"), line  # fmt: skip
    assert " (piece " in line and "--spm_model last.spm.model" in line, line

    older = tmp_path / "older.ckpt"  # as attnx wrote it before recording the hash
    state = torch.load(checkpoint, weights_only=True)
    del state["attnx"]["tokenizer_sha256"]
    torch.save(state, older)
    extra = ("--trainer.max_steps", "3", "--trainer.callbacks", "null", "--evaluation.bleu_samples", "0")
    for ckpt in (checkpoint, older):
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp_path)
            assert attnx(fit_args(other_corpus, "--ckpt_path", str(ckpt), *extra)) == 1
        err = capsys.readouterr().err
        assert (
            f"attnx fit: error: checkpoint {ckpt} was trained with another SentencePiece model than" in err
        ), err
    with pytest.MonkeyPatch.context() as mp:  # its own corpus: resumes
        mp.chdir(tmp_path)
        assert attnx(fit_args(corpus, "--ckpt_path", str(older), *extra)) == 0


def test_init_from_refuses_another_sentencepiece_model_as_ckpt_path_does(
    corpus: Path, other_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fit --init_from B.ckpt` where B was trained with another SentencePiece model of the same size trained on
    without a word; the check of `--ckpt_path` (`check_tokenizer`) refuses it, in the same line, before the
    first step."""
    from tests.checkpoints import tiny_checkpoint

    checkpoint = tiny_checkpoint(corpus, tmp_path / "b.ckpt")
    capsys.readouterr()
    rc, _ = fit(other_corpus, tmp_path, "--trainer.max_steps", "1", "--init_from", str(checkpoint))
    said = capsys.readouterr()
    assert rc == 1 and "Traceback" not in said.err and "init_from: the weights of" not in said.out, said.err
    assert said.err.splitlines()[-1].startswith(
        f"attnx fit: error: checkpoint {checkpoint} was trained with another SentencePiece model than "
        f"{other_corpus / 'spm.model'} (piece "
    ), said.err


def test_before_a_validation_gradients_are_released_eagerly_and_zeroed_in_place_while_captured() -> None:
    """Lightning's `on_validation_model_zero_grad` (and any `zero_grad` of the module): set to None in an
    eager run, so validation has their memory; the same tensors zeroed while a step engine is attached, since
    its graphs add into them."""
    task = TranslationTask(tiny_config())
    params = list(task.parameters())
    for p in params:
        p.grad = torch.ones_like(p)
    task.on_validation_model_zero_grad()
    assert all(p.grad is None for p in params)
    grads = [torch.ones_like(p) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    task.step_engine = object()  # attached: only its presence matters here
    task.on_validation_model_zero_grad()
    task.zero_grad(set_to_none=True)
    assert all(p.grad is g and not g.any() for p, g in zip(params, grads, strict=True))
