"""The guided-alignment loss: its value against a direct float64 computation, the gradient it sends (the chosen
layer and head only), its refusals, and a real `attnx fit` on an aligned corpus that trains and resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnx.components.alignment_loss import GuidedAlignmentLoss, alignment_cross_entropy
from attnx.components.loss import LabelSmoothedLoss
from attnx.data.batch import collate
from attnx.errors import ConfigError
from attnx.model import build_transformer
from tests.conftest import tiny_config
from tests.training.conftest import fit_args, read_metrics, train_losses


def test_the_term_is_the_cross_entropy_against_the_normalized_alignment_matrix() -> None:
    torch.manual_seed(0)
    attention = torch.softmax(torch.randn(2, 3, 4, dtype=torch.float64), dim=-1)  # (B, T, S)
    # row 0: target 0 -> sources 0 and 2, target 2 -> source 3; row 1: target 1 -> sources 0, 1, 2
    links = torch.tensor([[0, 0, 0], [0, 0, 2], [0, 2, 3], [1, 1, 0], [1, 1, 1], [1, 1, 2]])
    matrix = torch.zeros(2, 3, 4, dtype=torch.float64)
    matrix[links[:, 0], links[:, 1], links[:, 2]] = 1.0
    matrix = matrix / matrix.sum(-1, keepdim=True).clamp_min(1.0)  # each aligned row sums to 1
    expected = -(matrix * attention.log()).sum()
    value, aligned = alignment_cross_entropy(attention, links)
    assert value.item() == pytest.approx(expected.item(), rel=1e-12)
    assert int(aligned) == 3


def batch_with_links():
    batch = collate([([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])])
    batch.alignment = torch.tensor([[0, 0, 0], [0, 1, 2], [1, 0, 1], [1, 2, 0], [1, 2, 1]])
    return batch


def test_the_loss_adds_lambda_times_the_term_of_the_chosen_head_to_the_label_smoothed_loss() -> None:
    torch.manual_seed(0)
    model = build_transformer(tiny_config(vocab_size=32)).double()
    batch = batch_with_links()
    sums = GuidedAlignmentLoss(0.1, alignment_lambda=0.3, layer=0, head=2)(model, batch)
    plain = LabelSmoothedLoss(0.1)(model, batch)
    assert sums.loss.item() == pytest.approx(plain.loss.item(), rel=1e-9)  # the main loss as before
    weights: list[torch.Tensor] = []
    model.decode_features(batch.tgt_in, model.encode(batch.src, batch.src_mask), batch.src_mask, weights)
    expected, _ = alignment_cross_entropy(weights[0][:, 2], batch.alignment)
    assert sums.alignment.item() == pytest.approx(expected.item(), rel=1e-9)
    assert sums.objective().item() == pytest.approx(plain.loss.item() + 0.3 * expected.item(), rel=1e-9)
    assert int(sums.aligned) == 4  # (0, 0), (0, 1), (1, 0), (1, 2)


@pytest.mark.parametrize(("layer", "head"), [(-1, 1), (0, "mean")])
def test_the_gradient_flows_only_through_the_chosen_layer_and_head(layer: int, head: int | str) -> None:
    torch.manual_seed(0)
    model = build_transformer(tiny_config(vocab_size=32))
    sums = GuidedAlignmentLoss(0.1, alignment_lambda=1.0, layer=layer, head=head)(model, batch_with_links())
    sums.alignment.backward()
    chosen = layer % len(model.decoder_layers)
    for i, decoder_layer in enumerate(model.decoder_layers):
        grads = {n: p.grad for n, p in decoder_layer.named_parameters()}
        if i > chosen:  # layers above the guided one take no part
            assert all(g is None or not g.any() for g in grads.values()), i
            continue
        if i < chosen:
            continue
        attention = decoder_layer.cross_attn
        assert attention.out_proj.weight.grad is None or not attention.out_proj.weight.grad.any()
        q_rows, kv_rows = attention.sizes[0], attention.sizes[1]
        grad = attention.in_proj.weight.grad
        w_q, w_k, w_v = grad[:q_rows], grad[q_rows : q_rows + kv_rows], grad[q_rows + kv_rows :]
        assert not w_v.any()  # the values do not shape the weights
        per_head = w_q.view(attention.n_heads, attention.d_k, -1).flatten(1).abs().sum(1)
        heads = range(attention.n_heads) if head == "mean" else [head]
        assert all(per_head[h] > 0 for h in heads)
        assert all(per_head[h] == 0 for h in range(attention.n_heads) if h not in heads)
        assert w_k.any() and not any(
            p.grad is not None and p.grad.any() for p in decoder_layer.ffn.parameters()
        )


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ({"alignment_lambda": -0.5}, "model.loss.args.alignment_lambda"),
        ({"alignment_lambda": float("nan")}, "model.loss.args.alignment_lambda"),
        ({"head": -1}, "model.loss.args.head"),
        ({"head": "max"}, "model.loss.args.head"),
        ({"layer": 1.5}, "model.loss.args.layer"),
    ],
)
def test_wrong_arguments_are_refused_naming_the_key(args: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        GuidedAlignmentLoss(0.1, **args)


def test_a_layer_or_head_the_model_lacks_and_a_training_batch_without_alignments_are_refused() -> None:
    model = build_transformer(tiny_config(vocab_size=32))
    with pytest.raises(ConfigError, match=r"model\.loss\.args\.layer: decoder layer 5 does not exist"):
        GuidedAlignmentLoss(layer=5)(model, batch_with_links())
    with pytest.raises(ConfigError, match=r"model\.loss\.args\.head is 9, the model's layers have 4 heads"):
        GuidedAlignmentLoss(head=9)(model, batch_with_links())
    with pytest.raises(ConfigError, match="--train_align"):
        GuidedAlignmentLoss()(model, collate([([5, 6], [7, 8])]))
    model.eval()
    with torch.no_grad():  # validation of a split prepared without alignments: the main loss alone
        assert GuidedAlignmentLoss()(model, collate([([5, 6], [7, 8])])).alignment is None


# ------------------------------------------------------------------------------------------ a real attnx fit


@pytest.fixture(scope="module")
def aligned_corpus(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test slice prepared again with word alignments (source word i to target word i, as far as both go)."""
    root = corpus.parent
    for split in ("train", "val"):
        src = (root / f"{split}.en").read_text(encoding="utf-8").splitlines()
        tgt = (root / f"{split}.de").read_text(encoding="utf-8").splitlines()
        lines = [
            " ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split()))))
            for s, t in zip(src, tgt, strict=True)
        ]
        (root / f"{split}.align").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path_factory.mktemp("aligned") / "prepared"
    argv = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--spm_model", str(corpus / "spm.model")]
    argv += ["--train", str(root / "train"), "--valid", str(root / "val"), "--output", str(out)]
    argv += ["--train_align", str(root / "train.align"), "--valid_align", str(root / "val.align")]
    argv += ["--drop_wrong_language", "false", "--workers", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *argv], capture_output=True, text=True, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    return out


GUIDED = ["--model.loss", '{"name": "guided_alignment", "args": {"alignment_lambda": 0.5, "head": 1}}']
RUN = ["--evaluation.bleu_samples", "0", "--data.max_tokens", "1536", "--trainer.val_check_interval", "3"]


def fit(corpus: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "attnx", *fit_args(corpus, *GUIDED, *RUN, *extra)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_attnx_fit_trains_on_alignments_logs_the_term_apart_and_resumes_exactly(
    aligned_corpus: Path, tmp_path: Path
) -> None:
    fit(aligned_corpus, tmp_path / "whole", "--trainer.max_steps", "6")
    fit(aligned_corpus, tmp_path / "first", "--trainer.max_steps", "3")
    ckpt = tmp_path / "first" / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    fit(aligned_corpus, tmp_path / "rest", "--trainer.max_steps", "6", "--ckpt_path", str(ckpt))
    run = tmp_path / "whole" / "runs" / "tiny" / "version_0"
    rows = read_metrics(run)
    trained = [float(r["train/alignment_loss"]) for r in rows if r.get("train/alignment_loss")]
    validated = [float(r["val/alignment_loss"]) for r in rows if r.get("val/alignment_loss")]
    assert len(trained) == 6 and len(validated) == 2 and all(v > 0 for v in trained + validated)
    assert all(r.get("val/loss") for r in rows if r.get("val/alignment_loss"))  # the main loss beside it
    whole, rest = train_losses(run), train_losses(tmp_path / "rest" / "runs" / "tiny" / "version_0")
    assert sorted(rest) == [3, 4, 5]
    for step, loss in rest.items():
        assert loss == pytest.approx(whole[step], rel=1e-6, abs=1e-6), f"step {step}"


def test_attnx_fit_refuses_a_negative_lambda_in_one_line_naming_the_key(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnx.cli import main as attnx

    monkeypatch.chdir(tmp_path)
    loss = '{"name": "guided_alignment", "args": {"alignment_lambda": -0.1}}'
    assert attnx(fit_args(corpus, "--model.loss", loss)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "attnx fit: error: model.loss.args.alignment_lambda must be a finite number ≥ 0 (e.g. 0.05), got -0.1"
    ]


def test_guided_training_steps_read_back_once_per_optimizer_step(
    aligned_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alignment term adds no wait for the device: its counts stay there, its sums join the step's one read."""
    from attnx.cli import main as attnx
    from tests.training.test_host_syncs import QUIET, STEPS, count_read_backs

    sites = count_read_backs(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert attnx(fit_args(aligned_corpus, *GUIDED, *QUIET)) == 0
    checks = {site: n for site, n in sites.items() if "training/module.py" in site}
    assert list(checks.values()) == [STEPS], sites
    assert not {site: n for site, n in sites.items() if site not in checks}, sites
