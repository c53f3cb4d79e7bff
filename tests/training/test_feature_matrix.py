"""The feature matrix: every training feature through `attnx fit`, in each precision Lightning offers on a CPU
(`64-true` casts the module in `strategy.setup`, exactly where a GPU run moves it), alone and all together, in
one process and under 2-process DDP, each with a resume.

Each case trains a tiny model for 4 steps (dropout on, a validation at steps 2 and 4, a checkpoint every step)
and checks that:
- after the strategy's setup, every tensor the module, the optimizer and each callback hold lives on the
  module's device and in its dtype ([`HeldTensors`][tests.training.matrix_main.HeldTensors]);
- the run resumed from its own step-2 checkpoint ends with the uninterrupted run's weights (and EMA).

Features: EMA, LoRA, activation checkpointing, subword sampling, weighted corpora, guided alignment, today's
components (pre-norm RMSNorm, SwiGLU, rotary positions, grouped-query attention) and captured steps (through the
replaying CPU backend). Each runs alone in `32-true` and `64-true`; four runs with every feature on but one of
each pair `attnx fit` refuses (EMA with LoRA, guided alignment with subword sampling: one line each, tested
here) run in all four precisions, so every other pair of features meets in each of them; two of those four,
which hold every feature between them, run under 2-process DDP (gloo) with two batches a step. The one-process
cases run in this process, the DDP ones as processes launched the way a user launches them.

The features together, and under DDP, are in
[`test_feature_matrix_together`][tests.training.test_feature_matrix_together] (two files, so that two test
workers share the matrix).

    python -m pytest tests/training/test_feature_matrix.py tests/training/test_feature_matrix_together.py -n 0
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch

from attnx.checkpoint import read_checkpoint
from attnx.checkpoint.ema import EMA_KEY
from attnx.cli import main as attnx
from attnx.training import captured_steps
from tests.training.conftest import TINY
from tests.training.test_capture import FakeGraphs

PRECISIONS = ["32-true", "bf16-mixed", "bf16-true", "64-true"]

SIZES = {"big": 160, "small": 60, "val": 30}  # Multi30k's first pairs, cut into two named training corpora

MODEL = {
    "d_model": "16",
    "n_heads": "4",
    "d_ff": "32",
    "encoder_layers": "1",
    "decoder_layers": "1",
    "dropout": "0.2",
}
RUN = [
    *(f"--model.transformer.{key}={value}" for key, value in MODEL.items()),
    *("--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1"),
    *("--evaluation.bleu_samples", "0", "--data.max_tokens", "256", "--data.shape_buckets", "4"),
    "--trainer.callbacks+=tests.training.matrix_main.HeldTensors",
]

COMPONENTS = [
    "--model.transformer.norm_position=pre",
    '--model.transformer.norm={"name": "rmsnorm"}',
    '--model.transformer.feedforward={"name": "swiglu"}',
    '--model.transformer.positional={"name": "rotary"}',
    '--model.transformer.self_attention={"name": "multihead", "args": {"kv_heads": 2}}',
]


def features(parent: Path) -> dict[str, list[str]]:
    """Each training feature as the options that turn it on; LoRA trains adapters on `parent`'s weights."""
    return {
        "ema": ["--ema.decay", "0.6"],
        "lora": ["--lora.rank", "2", "--init_from", str(parent)],
        "activation checkpointing": ["--model.transformer.activation_checkpointing", "true"],
        "subword sampling": ["--data.subword_sampling.alpha", "0.1"],
        "weighted corpora": ["--data.corpus_weights", '{"big": 1, "small": 2}'],
        "guided alignment": [
            "--model.loss",
            '{"name": "guided_alignment", "args": {"alignment_lambda": 0.5, "head": 1}}',
        ],
        "components": COMPONENTS,
        "captured steps": ["--cuda_graphs", "true"],
    }


FEATURES = list(features(Path()))
REFUSED = {
    ("ema", "lora"): "lora and ema together are not supported",
    (
        "guided alignment",
        "subword sampling",
    ): "model.loss guided_alignment and data.subword_sampling.alpha 0.1",
}
"""The pairs `attnx fit` refuses, in one line: an EMA of adapters beside frozen weights, and alignments of the
prepared segmentation beside batches segmented anew."""


def together() -> dict[str, list[str]]:
    """Every feature on at once but one of each refused pair: four runs in which every other pair meets."""
    paired = {f for pair in REFUSED for f in pair}
    runs = {}
    for kept in itertools.product(*REFUSED):
        left_out = sorted(paired - set(kept))
        runs[f"all but {' and '.join(left_out)}"] = [f for f in FEATURES if f not in left_out]
    return runs


TOGETHER = together()


@pytest.fixture(scope="module")
def matrix_corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(shared_data, tmp_path_factory)


def make_corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two named training corpora of Multi30k en-de with word alignments (source word i to target word i), one
    SentencePiece model: a folder every feature can train on."""
    root = tmp_path_factory.mktemp("matrix")
    start = 0
    for name, n in SIZES.items():
        texts = {}
        for lang in ("en", "de"):
            with gzip.open(
                shared_data / "multi30k" / f"{'val' if name == 'val' else 'train'}.{lang}.gz", "rt"
            ) as f:
                lines = f.readlines()[(0 if name == "val" else start) :][:n]
            texts[lang] = lines
            (root / f"{name}.{lang}").write_text("".join(lines), encoding="utf-8")
        links = [
            " ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split()))))
            for s, t in zip(texts["en"], texts["de"], strict=True)
        ]
        (root / f"{name}.align").write_text("\n".join(links) + "\n", encoding="utf-8")
        start += 0 if name == "val" else n
    out = root / "prepared"
    argv = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--vocab_size", "200", "--workers", "1"]
    argv += ["--drop_wrong_language", "false", "--output", str(out)]
    argv += ["--valid", str(root / "val"), "--valid_align", str(root / "val.align")]
    for name in ("big", "small"):
        argv += ["--train", f"{name}={root / name}", "--train_align", str(root / f"{name}.align")]
    assert attnx(argv) == 0
    return out


def fit_argv(corpus: Path, precision: str) -> list[str]:
    return ["fit", "--config", str(TINY), "--data.data_dir", str(corpus), "--trainer.precision", precision]


def fit_here(corpus: Path, cwd: Path, precision: str, *extra: str, fake: bool = True) -> Path:
    """`attnx fit` in this process, its steps captured by the replaying backend where `--cuda_graphs` asks for
    them (the backend captures on CPUs as CUDA graphs do on GPUs: by default where batches come in shape buckets);
    the run folder."""
    cwd.mkdir(parents=True)
    argv = [*fit_argv(corpus, precision), *RUN, *extra]
    with pytest.MonkeyPatch.context() as mp:
        if fake and "--cuda_graphs" in extra:  # on a GPU (fake=False) CUDA graphs capture
            mp.setattr(captured_steps, "BACKENDS", {"cpu": FakeGraphs})
        mp.chdir(cwd)
        assert attnx(argv) == 0, argv
    return cwd / "runs" / "tiny" / "version_0"


@pytest.fixture(scope="module")
def parents(matrix_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_parents(matrix_corpus, tmp_path_factory)


def make_parents(matrix_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Models of the matrix's shape trained for 4 steps, with the paper's components and with today's: what
    LoRA's adapters start from."""
    work = tmp_path_factory.mktemp("parents")
    runs = {
        "paper": fit_here(matrix_corpus, work / "paper", "32-true"),
        "components": fit_here(matrix_corpus, work / "components", "32-true", *COMPONENTS),
    }
    return {name: run / "checkpoints" / "last.ckpt" for name, run in runs.items()}


def case_options(case: str, parents: dict[str, Path]) -> list[str]:
    if case in TOGETHER:
        options = features(parents["components"])
        return [arg for name in TOGETHER[case] for arg in options[name]]
    return features(parents["paper"])[case]


def resuming(options: list[str], checkpoint: Path) -> list[str]:
    """`options` of a run resumed from `checkpoint`: a LoRA run resumes without `--init_from`, as a user
    resumes it (its weights are in the checkpoint)."""
    if "--init_from" in options:
        i = options.index("--init_from")
        options = options[:i] + options[i + 2 :]
    return [*options, "--ckpt_path", str(checkpoint)]


def checkpoint_at(run: Path, step: int) -> Path:
    """The run's checkpoint written after optimizer step `step`."""
    for path in sorted((run / "checkpoints").glob("*.ckpt")):
        if path.name not in ("last.ckpt", "averaged.ckpt"):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if ckpt["global_step"] == step:
                return path
    raise AssertionError(f"no checkpoint of step {step} in {run}: {sorted((run / 'checkpoints').iterdir())}")


def held_right(cwd: Path, ranks: int = 1) -> None:
    for rank in range(ranks):
        report = json.loads((cwd / f"held_tensors.rank{rank}.json").read_text(encoding="utf-8"))
        assert report["checked"] > 0 and not report["wrong"], report


def same_weights(whole: Path, resumed: Path, precision: str) -> None:
    expected, got = (read_checkpoint(run / "checkpoints" / "last.ckpt") for run in (whole, resumed))
    assert got["global_step"] == expected["global_step"] == 4
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if "16" not in precision else {"rtol": 1e-2, "atol": 1e-3}
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, **tolerance, msg=key)
    if EMA_KEY in expected:
        for key, value in expected[EMA_KEY]["training"].items():
            torch.testing.assert_close(got[EMA_KEY]["training"][key], value, **tolerance, msg=key)


ALONE = ["32-true", "64-true"]
"""The precisions each feature runs alone in: fp32, and `64-true`, which casts the module where a GPU run moves
it; in bf16 every feature runs beside the others (each is in two of the four runs together)."""

IN_ONE_PROCESS = [(p, f) for p in ALONE for f in FEATURES]


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "case"), IN_ONE_PROCESS)
def test_a_feature_holds_in_each_precision_and_resumes(
    matrix_corpus: Path, parents: dict[str, Path], tmp_path: Path, precision: str, case: str
) -> None:
    resumes_alike(matrix_corpus, tmp_path, precision, case_options(case, parents))


def resumes_alike(matrix_corpus: Path, tmp_path: Path, precision: str, options: list[str]) -> None:
    """The run with `options` holds its tensors right, and resumed from its step-2 checkpoint ends as it does."""
    whole = fit_here(matrix_corpus, tmp_path / "whole", precision, *options)
    held_right(tmp_path / "whole")
    middle = tmp_path / "middle.ckpt"
    shutil.copy(checkpoint_at(whole, 2), middle)
    resumed = fit_here(matrix_corpus, tmp_path / "resumed", precision, *resuming(options, middle))
    held_right(tmp_path / "resumed")
    same_weights(whole, resumed, precision)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("case", TOGETHER)
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "32-true"])
def test_on_cuda_every_feature_together_holds_and_resumes(
    matrix_corpus: Path, parents: dict[str, Path], tmp_path: Path, precision: str, case: str
) -> None:
    """The runs together on one GPU, steps captured as CUDA graphs: every tensor on the GPU in the module's
    dtype after the strategy's setup, and the resumed run within bf16's tolerance of the uninterrupted one (the
    GPU's kernels need not add in the same order twice)."""
    options = [*case_options(case, parents), "--trainer.accelerator", "gpu", "--trainer.devices", "1"]
    whole = fit_here(matrix_corpus, tmp_path / "whole", precision, *options, fake=False)
    held_right(tmp_path / "whole")
    middle = tmp_path / "middle.ckpt"
    shutil.copy(checkpoint_at(whole, 2), middle)
    resumed = fit_here(matrix_corpus, tmp_path / "resumed", precision, *resuming(options, middle), fake=False)
    held_right(tmp_path / "resumed")
    same_weights(whole, resumed, "bf16")


@pytest.mark.parametrize("pair", REFUSED)
def test_the_pairs_fit_refuses_are_one_line_before_the_first_step(
    matrix_corpus: Path, parents: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], pair
) -> None:
    options = features(parents["paper"])
    argv = [*fit_argv(matrix_corpus, "32-true"), *RUN, *options[pair[0]], *options[pair[1]]]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        capsys.readouterr()
        assert attnx(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and REFUSED[pair] in err[0], err
    assert not (tmp_path / "runs" / "tiny" / "version_0" / "checkpoints").exists()
