"""Today's components through the whole run: fit, resume, checkpoint averaging, an ensemble, forced scoring
with alignments and `attnx test`, from a config that names them (tiny.yaml with every new component)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnx.checkpoint import load_model
from attnx.cli import main as attnx
from attnx.data.batch import collate
from attnx.inference.config import SearchConfig
from attnx.inference.decoder import EnsembleDecoder, ModelDecoder
from attnx.inference.search import generate
from tests.training.conftest import _one_thread, fit_args, read_metrics  # noqa: F401 (one thread a module)

MODERN = """model:
  transformer:
    norm_position: pre
    norm: {name: rmsnorm}
    feedforward: {name: swiglu}
    positional: {name: %s}
    self_attention: {name: multihead, args: {kv_heads: 2}}
    cross_attention: {name: multihead, args: {kv_heads: 1}}
"""


@pytest.fixture(scope="module", params=["rotary", "t5_relative"])
def run(request, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp(f"modern_{request.param}")
    (work / "modern.yaml").write_text(MODERN % request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert attnx(fit_args(corpus, "--config", "modern.yaml")) == 0
    return work / "runs" / "tiny" / "version_0"


def test_fit_resume_and_average_work_with_the_components(run: Path, corpus: Path, tmp_path, monkeypatch):
    checkpoints = run / "checkpoints"
    averaged = load_model(checkpoints / "averaged.ckpt")
    layer = averaged.model.decoder_layers[0]
    assert type(layer.ffn).__name__ == "SwiGLUFeedForward" and layer.self_attn.kv_heads == 2
    assert averaged.model.tgt_positional.acts_on in ("queries_keys", "scores")
    steps = sorted(checkpoints.glob("step*.ckpt")) or sorted(checkpoints.glob("*.ckpt"))
    assert len(steps) >= 3
    monkeypatch.chdir(tmp_path)
    (tmp_path / "modern.yaml").write_text((run.parents[2] / "modern.yaml").read_text())
    resumed = fit_args(corpus, "--config", "modern.yaml", "--trainer.max_steps", "10", "--ckpt_path")
    assert attnx([*resumed, str(checkpoints / "last.ckpt")]) == 0
    ours = tmp_path / "runs" / "tiny" / "version_0"
    rows = [int(r["step"]) for r in read_metrics(ours) if r["train/loss"]]
    assert sorted(set(rows)) == [8, 9]
    saved = torch.load(ours / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 10 and saved["attnx"]["transformer"]["feedforward"]["name"] == "swiglu"


def test_an_ensemble_and_forced_scoring_with_alignments_work_with_the_components(run: Path):
    last = load_model(run / "checkpoints" / "last.ckpt").model.double()
    averaged = load_model(run / "checkpoints" / "averaged.ckpt").model.double()
    batch = collate([([5, 6, 7, 8, 9], [10, 11, 12]), ([13, 14, 15], [16, 17, 18, 19])])
    config = SearchConfig(beam=3, max_len_a=0.0, max_len_b=6, nbest=1)
    with torch.no_grad():
        one = generate(last, batch.src, batch.src_mask, config)
        same = generate(
            EnsembleDecoder([ModelDecoder(last), ModelDecoder(last)]), batch.src, batch.src_mask, config
        )
        assert [h[0].tokens for h in one] == [h[0].tokens for h in same]
        assert [h[0].score for h in one] == pytest.approx([h[0].score for h in same], abs=1e-6)
        both = EnsembleDecoder([ModelDecoder(last), ModelDecoder(averaged)])
        assert len(generate(both, batch.src, batch.src_mask, config)) == 2
        scores, attention = ModelDecoder(last).forced(
            batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, attention=True
        )
        logits = last(batch.src, batch.tgt_in, batch.src_mask)
        expected = torch.log_softmax(logits, -1).gather(2, batch.tgt_out.unsqueeze(2)).squeeze(2)
        real = batch.tgt_out != 0
        torch.testing.assert_close(scores[real], expected[real])
        assert attention.shape == (2, batch.tgt_in.shape[1], batch.src.shape[1])
        torch.testing.assert_close(
            attention.sum(-1)[real], torch.ones(int(real.sum()), dtype=attention.dtype)
        )


def test_attnx_test_decodes_the_averaged_checkpoint(run: Path, corpus: Path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = fit_args(corpus, "--ckpt_path", str(run / "checkpoints" / "averaged.ckpt"), subcommand="test")
    assert attnx([*args, "--config", str(run.parents[2] / "modern.yaml")]) == 0
    assert "BLEU" in capsys.readouterr().out
