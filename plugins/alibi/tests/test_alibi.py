"""The plugin's own tests: ALiBi's slopes and bias against the paper, in a model through the public seam,
cached decoding equal to the full pass, and training by name once pip-installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnx.model import build_transformer
from attnx.model.builders import ComponentSpec, TransformerConfig
from attnx.plugins import collect, plugin_manager
from attnx_alibi import ALiBi, alibi_slopes

PLUGIN = Path(__file__).resolve().parents[1]
REPO = PLUGIN.parents[1]


def test_slopes_are_the_papers_geometric_sequences():
    assert alibi_slopes(8) == [1 / 2**h for h in range(1, 9)]  # §3: 1/2, 1/4, ..., 1/256 for 8 heads
    assert alibi_slopes(16)[:2] == [2**-0.5, 2**-1]
    assert alibi_slopes(6) == alibi_slopes(4) + [2**-1, 2**-3]  # 4 of 2^(-2h), then every other of 8 heads'


@pytest.mark.parametrize("causal", [False, True])
def test_bias_is_minus_the_slope_times_the_distance(causal):
    bias = ALiBi(4, 64)(3, 7, 4, causal)  # queries at 4, 5, 6 over keys 0..6
    assert bias.shape == (4, 3, 7) and bias.dtype == torch.float64
    for h, m in enumerate(alibi_slopes(4)):
        for i in range(3):
            for j in range(7):
                assert float(bias[h, i, j]) == -m * abs(4 + i - j)


def model_with_alibi(**overrides):
    pm = plugin_manager(entry_points=False)
    import attnx_alibi

    pm.register(attnx_alibi, name="attnx_alibi")
    try:
        registry = collect(pm)
    finally:
        pm.unregister(name="attnx_alibi")
    values = dict(
        vocab_size=50, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0
    )
    config = TransformerConfig(**(values | overrides), positional=ComponentSpec("alibi"))
    return build_transformer(config, registry), registry


def test_the_model_adds_it_to_self_attention_scores_and_decodes_incrementally_as_the_full_pass():
    torch.manual_seed(0)
    model, _ = model_with_alibi(norm_position="pre")
    model = model.double().eval()
    src = torch.randint(4, 50, (2, 7))
    src_mask = torch.ones(2, 7, dtype=torch.bool)
    src_mask[1, 5:] = False
    tgt = torch.randint(4, 50, (2, 6))
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        state = model.start_decoding(memory, src_mask)
        for i in range(6):
            torch.testing.assert_close(model.decode_step(tgt[:, i], state), full[:, i], rtol=1e-9, atol=1e-9)
        # positions act: the same tokens in another order encode differently beyond that permutation
        # (a reversal would keep every distance, so one token moves to the front instead)
        order = torch.tensor([3, 0, 1, 2, 4, 5, 6])
        everything = torch.ones(2, 7, dtype=torch.bool)
        moved = model.encode(src[:, order], everything)
        assert not torch.allclose(moved, model.encode(src, everything)[:, order])


def test_an_attention_that_takes_no_score_bias_is_refused_naming_both():
    _, registry = model_with_alibi()
    from attnx.components.attention import MultiHeadAttention
    from attnx.registry import Kind

    class Plain(MultiHeadAttention):
        positions_accepted = ()

    registry.add(Kind.ATTENTION, "plain", Plain)
    config = TransformerConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        d_ff=64,
        encoder_layers=1,
        decoder_layers=1,
        positional=ComponentSpec("alibi"),
        self_attention=ComponentSpec("plain"),
    )
    with pytest.raises(
        ValueError, match="'alibi' adds a bias to the attention scores, but attention component 'plain'"
    ):
        build_transformer(config, registry)


def test_trains_by_name_once_installed(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(target), str(PLUGIN)],
        check=True,
        capture_output=True,
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(target), str(REPO / "src")])}
    listed = subprocess.run(
        [sys.executable, "-m", "attnx", "plugins"], env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    line = next(line for line in listed.stdout.splitlines() if line.strip().startswith("alibi"))
    assert "attnx_alibi.ALiBi" in line and "[attnx-alibi 0.1.0]" in line
    script = """
import torch
from attnx.data.batch import collate
from attnx.model import TransformerConfig, build_transformer
torch.manual_seed(0)
config = TransformerConfig.from_dict(dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, encoder_layers=2,
    decoder_layers=2, dropout=0.0, positional={"name": "alibi"}))
model = build_transformer(config)
assert type(model.src_positional).__name__ == "ALiBi"
batch = collate([([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14, 15, 16, 17])])
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
for _ in range(20):
    logits = model(batch.src, batch.tgt_in, batch.src_mask)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0)
    optimizer.zero_grad(); loss.backward(); optimizer.step(); losses.append(loss.item())
assert losses[-1] < losses[0] / 2, losses
print("trained")
"""
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]
