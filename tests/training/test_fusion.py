"""Fused pointwise kernels: the compiled tails compute what the plain layers compute, forward and backward,
one graph for every layer and shape."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from attnx.components.feedforward import ReluFeedForward
from attnx.components.gated import GatedFeedForward
from attnx.model import ComponentSpec, build_transformer
from attnx.model.layers import PostNorm, PreNorm
from attnx.training.fusion import fuse_pointwise
from tests.conftest import tiny_config

FFNS = {name: ComponentSpec(name, {"dropout": 0.2}) for name in ("relu", "swiglu", "geglu")}


def step(model, src, tgt, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(seed)
    src_mask = torch.arange(src.shape[1]) < torch.tensor([[src.shape[1]], [3], [2]])
    logits = model(src, tgt, src_mask)
    model.zero_grad()
    (logits * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("norm_position", "ffn"), [("post", "relu"), ("pre", "relu"), ("post", "swiglu"), ("pre", "geglu")]
)
def test_fused_and_plain_layers_agree_in_float64(norm_position: str, ffn: str) -> None:
    """With dropout on every sub-layer and in the FFN (the paper's, or a gated one): the tracing backend keeps
    PyTorch's dropout, so the same seed draws the same masks and everything matches exactly."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = (
        build_transformer(tiny_config(norm_position=norm_position, dropout=0.3, feedforward=FFNS[ffn]))
        .double()
        .train()
    )
    fused = copy.deepcopy(plain)
    layers = len(plain.encoder_layers) * (2 + 1) + len(plain.decoder_layers) * (3 + 1)
    assert fuse_pointwise(fused, backend="aot_eager") == layers
    assert fuse_pointwise(fused, backend="aot_eager") == layers  # already fused: nothing compiled twice
    counters.clear()
    for length in (5, 7, 9):  # other shapes: no new graph
        src, tgt = torch.randint(4, 50, (3, length)), torch.randint(4, 50, (3, length - 1))
        expected, expected_grads = step(plain, src, tgt)
        out, grads = step(fused, src, tgt)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the residual merge and the FFN's hidden layer; a gated network's bias-free W2 returns a view of its
    # matrix product, which the compiler guards apart from the attention's output: the merge once more
    assert counters["stats"]["unique_graphs"] == (2 if ffn == "relu" else 3)
    for module in fused.modules():
        if isinstance(module, (PostNorm, PreNorm)):
            assert "merge" in vars(module)
        if isinstance(module, (ReluFeedForward, GatedFeedForward)):
            assert "hidden" in vars(module)
    assert not any(k.endswith(("merge", "hidden")) for k in fused.state_dict())
    assert fused.state_dict().keys() == plain.state_dict().keys()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_kernels_on_cuda_compute_what_plain_layers_do_in_bf16() -> None:
    """The real backend (Triton kernels): eval mode matches the plain layers within bf16 rounding; in training
    the compiled dropout drops about its share of the FFN's hidden units, and the step's gradients are finite."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = tiny_config(
        d_model=256, n_heads=4, d_ff=1024, dropout=0.1, feedforward=ComponentSpec("relu", {"dropout": 0.5})
    )
    plain = build_transformer(config).cuda()
    fused = copy.deepcopy(plain)
    fuse_pointwise(fused)
    src, tgt = torch.randint(4, 50, (3, 40), device="cuda"), torch.randint(4, 50, (3, 33), device="cuda")
    src_mask = torch.arange(40, device="cuda") < torch.tensor([[40], [30], [20]], device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        expected = plain.eval()(src, tgt, src_mask)
        out = fused.eval()(src, tgt, src_mask)
    torch.testing.assert_close(out.float(), expected.float(), rtol=0.02, atol=0.05)
    fused.train()
    ffn = fused.encoder_layers[0].ffn
    with torch.autocast("cuda", dtype=torch.bfloat16):
        x = torch.randn(8, 64, 256, device="cuda")
        hidden = ffn.hidden(x)
        relu = torch.relu(ffn.w1(x))
        dropped = ((hidden == 0) & (relu > 0)).sum() / (relu > 0).sum()
        fused(src, tgt, src_mask).float().sum().backward()
    assert 0.4 < dropped.item() < 0.6
    assert all(torch.isfinite(p.grad).all() for p in fused.parameters() if p.grad is not None)


def test_the_fit_callback_fuses_on_cuda_only_and_says_so(capsys) -> None:
    from types import SimpleNamespace

    from attnx.training.fusion import FusedKernels
    from attnx.training.module import TranslationTask

    def trainer(device: str) -> SimpleNamespace:
        return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))

    task = TranslationTask(tiny_config())
    callback = FusedKernels()
    callback.setup(trainer("cpu"), task, "fit")
    assert callback.fused == 0 and not any("merge" in vars(m) for m in task.model.modules())
    assert capsys.readouterr().out == "fused kernels: off on cpu (CUDA only); the layers run as they are\n"
    callback.setup(trainer("cuda"), task, "validate")  # not training: nothing to fuse
    assert callback.fused == 0 and capsys.readouterr().out == ""
    callback.setup(trainer("cuda"), task, "fit")  # compiled lazily: nothing runs on a GPU here
    assert callback.fused == 2 * 3 + 2 * 4
    assert sum("merge" in vars(m) or "hidden" in vars(m) for m in task.model.modules()) == callback.fused
    assert capsys.readouterr().out.startswith("fused kernels: the pointwise tails of 14 residual connections")
    plugin = TranslationTask(tiny_config())
    for layer in [*plugin.model.encoder_layers, *plugin.model.decoder_layers]:
        layer.ffn = torch.nn.Sequential(layer.ffn.w1, torch.nn.ReLU(), layer.ffn.w2)  # a plugin's own FFN
    callback.setup(trainer("cuda"), plugin, "fit")
    assert callback.fused == 2 * 2 + 2 * 3  # the residual connections alone
    assert capsys.readouterr().out.startswith("fused kernels: Sequential left as it is (no compiled tail")
