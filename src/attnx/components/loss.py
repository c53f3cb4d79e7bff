"""§5.4 Label smoothing: cross-entropy against a smoothed target distribution, padding ignored.

The training loss is a registered component of kind `loss`, chosen in the config (`model.loss`):

* `label_smoothed` ([`LabelSmoothedLoss`][attnx.components.loss.LabelSmoothedLoss], the default): projects only the counted target positions
  onto the vocabulary and fuses the projection with the loss, chunk by chunk
  ([`projected_label_smoothed_nll`][attnx.components.loss.projected_label_smoothed_nll]). This is what `attnx fit` runs.
* `reference` ([`ReferenceLoss`][attnx.components.loss.ReferenceLoss]): the plain computation — full `(B, T, V)` logits from
  `Transformer.decode`, then [`label_smoothed_nll`][attnx.components.loss.label_smoothed_nll]. Slower; kept as the definition the fused loss is
  tested against.

A loss component is built as `factory(epsilon, **args)` and called as `loss(model, batch) -> LossSums`, where
`model` is what [`TranslationModel`][attnx.components.loss.TranslationModel] describes (the
[`Transformer`][attnx.model.transformer.Transformer]).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from attnx.components.values import is_number, optional_integer
from attnx.data.batch import Batch
from attnx.errors import ConfigError
from attnx.hookspecs import hookimpl


class TranslationModel(Protocol):
    """What a loss uses of the model it scores: the [`Transformer`][attnx.model.transformer.Transformer]'s
    teacher-forced passes (shapes as there) and its pre-softmax weight and bias. A loss is a component, below
    the model in the layers, so it names the model by what it does rather than by importing it."""

    pad_id: int
    output_bias: Tensor | None  # (V,) added to the logits, or None (the paper's model)

    @property
    def output_weight(self) -> Tensor:  # (V, D)
        ...

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:  # (B, S, D)
        ...

    def decode_features(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        weights: list | None = None,
        weights_layer: int | None = None,
    ) -> Tensor:  # (B, T, D); `weights` receives (B, H, T, S) encoder-decoder attention
        ...

    def __call__(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor) -> Tensor:  # (B, T, V) logits
        ...


class LossSums(NamedTuple):
    """Sums over the counted (non-padding) target positions of one batch."""

    loss: Tensor  # label-smoothed cross-entropy, summed; what is optimized (after dividing by `tokens`)
    nll: Tensor  # plain negative log-likelihood of the reference tokens, summed; perplexity = exp(nll / tokens)
    tokens: Tensor  # number of counted positions
    alignment: Tensor | None = None
    """Guided alignment only: the cross-entropy of the attention against the alignments, summed over the
    aligned target positions ([attnx.components.alignment_loss][])."""
    aligned: Tensor | None = None
    """Guided alignment only: the number of target positions that have an alignment."""
    alignment_lambda: float = 0.0
    """The weight of `alignment` in the objective."""

    def objective(self) -> Tensor:
        """What is optimized (before dividing by `tokens`): `loss`, plus `alignment_lambda × alignment`."""
        if self.alignment is None:
            return self.loss
        return self.loss + self.alignment_lambda * self.alignment


def alignment_sums(sums: LossSums) -> Tensor:
    """`(4,)`: the loss and NLL sums, the alignment cross-entropy sum and the aligned target positions (zeros
    without guided alignment): what training and validation add up per batch."""
    if sums.alignment is None or sums.aligned is None:
        return torch.cat([torch.stack([sums.loss, sums.nll]), sums.loss.new_zeros(2)])
    return torch.stack([sums.loss, sums.nll, sums.alignment, sums.aligned.to(sums.loss.dtype)])


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> LossSums:
    """Label-smoothed cross-entropy (§5.4, ε_ls), summed over the positions where `target != ignore_index`.

    The target distribution puts `1 - ε` on the reference token and spreads `ε` uniformly over all
    `V` vocabulary entries (the reference and padding included), so per position:

    ```text
    loss = (1 - ε) · (-log p_y) + ε · mean_v (-log p_v)
    ```

    This is the cross-entropy form: it equals `torch.nn.functional.cross_entropy(..., label_smoothing=ε)`
    and differs from the KL-divergence form `KL(q ‖ p)` only by the constant entropy of `q`, so both have
    the same gradients. `logits` `(..., V)` (any float dtype; computed in float32), `target` `(...)`.
    """
    _check(epsilon)
    keep = target != ignore_index  # (...)
    lprobs = torch.log_softmax(
        logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1
    )  # (..., V)
    nll = torch.where(keep, -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1), 0.0).sum()
    uniform = torch.where(keep, -lprobs.mean(dim=-1), 0.0).sum()
    loss = (1.0 - epsilon) * nll + epsilon * uniform
    return LossSums(loss=loss, nll=nll.detach(), tokens=keep.sum())


def _check(epsilon: float) -> None:
    if not is_number(epsilon) or not 0.0 <= epsilon < 1.0:
        raise ConfigError(f"label smoothing ε must be in [0, 1), got {epsilon}")


def projected_label_smoothed_nll(
    features: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    chunk_rows: int | None = None,
    ignore_index: int | None = None,
    bias: Tensor | None = None,
) -> LossSums:
    """[`label_smoothed_nll`][attnx.components.loss.label_smoothed_nll] of `logits = features @ weight.T + bias`, without materializing the logits.

    `features` `(N, D)` are the decoder outputs of the `N` counted target positions, `weight`
    `(V, D)` the pre-softmax projection, `bias` `(V,)` the logits' bias or None, `target` `(N,)`. The rows are processed `chunk_rows` at a
    time (default: on CPU as many rows as fill this machine's L2 cache with float32 logits, read at run time
    ([`cpu_chunk_rows`][attnx.components.loss.cpu_chunk_rows]), so that a chunk's logits, softmax and gradient stay in cache; all rows at once on
    GPUs): each chunk's logits, loss and the gradients of `features` and `weight` are
    computed during the forward pass (the bias's too; the gradient of the logits is `softmax - q` for the smoothed target
    `q`), and the backward pass only scales them. On the 8k-vocabulary model this takes the projection and
    loss from 364 to 213 ms per step on one core (`bench/bench_train.py`). Under autocast the matrix
    products run in the autocast dtype and the softmax in float32, as they would without fusion.

    With `ignore_index`, rows whose target is `ignore_index` count nothing (loss, NLL, tokens, gradients):
    a batch of a fixed shape can then pass all its positions, padding included, and its shape no longer
    depends on how many of them are counted (what a captured step needs: [attnx.training.capture][]).
    """
    _check(epsilon)
    if chunk_rows is None:
        chunk_rows = len(features) if features.device.type == "cuda" else cpu_chunk_rows(weight.shape[0])
    keep = None if ignore_index is None else target != ignore_index  # (N,), computed on the device
    trained = bias is not None and bias.requires_grad
    if torch.is_grad_enabled() and (features.requires_grad or weight.requires_grad or trained):
        loss, nll = _ProjectedLoss.apply(features, weight, target, epsilon, chunk_rows, keep, bias)
    else:
        loss, nll, *_ = _chunked(features, weight, target, epsilon, chunk_rows, False, keep, bias)
    if keep is not None:
        return LossSums(loss=loss, nll=nll, tokens=keep.sum())
    # torch.full, not torch.tensor: a fill on the device, where a copy from the host would wait for the GPU
    return LossSums(loss=loss, nll=nll, tokens=torch.full((), len(target), device=features.device))


@functools.cache
def l2_cache_bytes() -> int:
    """This machine's per-core L2 cache size, read from Linux's sysfs; 1 MiB where it cannot be read."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() != "2":
                continue
            size = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return 2**20


def cpu_chunk_rows(vocab_size: int) -> int:
    """Rows of float32 logits per chunk on CPU: about four times the L2 cache, at least 64 rows."""
    return max(64, l2_cache_bytes() // vocab_size)


def _chunked(
    features: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    rows: int,
    with_grads: bool,
    keep: Tensor | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Loss and NLL sums and, `with_grads`, their (loss) gradients for features, weight and bias (None
    without a bias); rows where `keep` `(N,)` is False count nothing (weighted on the `D`-wide side, never on
    the `V`-wide one, except for the bias's `(V,)` sum)."""
    device = features.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else features.dtype
    exact = torch.promote_types(dtype, torch.float32)  # softmax and sums: float32 at least
    vocab = weight.shape[0]
    loss = torch.zeros((), dtype=exact, device=features.device)
    nll = torch.zeros((), dtype=exact, device=features.device)
    grad_features = torch.empty_like(features) if with_grads else None
    grad_weight = torch.zeros_like(weight) if with_grads else None
    grad_bias = torch.zeros_like(bias, dtype=exact) if with_grads and bias is not None else None
    with torch.autocast(device, enabled=False):
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        for start in range(0, len(features), rows):
            x = features[start : start + rows].to(dtype)  # (c, D)
            y = target[start : start + rows].unsqueeze(1)  # (c, 1)
            logits = x @ w.T if b is None else torch.addmm(b, x, w.T)  # (c, V)
            lprobs = torch.log_softmax(logits.to(exact), dim=-1)
            if keep is None:
                chunk_nll = -lprobs.gather(1, y).sum()
                uniform = lprobs.sum()
            else:
                counted = keep[start : start + rows].to(exact)  # (c,)
                chunk_nll = -(lprobs.gather(1, y).squeeze(1) * counted).sum()
                uniform = (lprobs.sum(dim=1) * counted).sum()
            loss += (1.0 - epsilon) * chunk_nll - (epsilon / vocab) * uniform
            nll += chunk_nll
            if not with_grads:
                continue
            # d loss / d logits = softmax - q,  q = (1 - ε)·onehot(y) + ε / V
            grad = lprobs.exp_().sub_(epsilon / vocab)
            grad.scatter_add_(1, y, grad.new_full(y.shape, epsilon - 1.0))
            if grad_bias is not None:  # before the cast: the (V,) sum over rows in float32 at least
                counted = None if keep is None else keep[start : start + rows].to(exact)
                grad_bias += grad.sum(0) if counted is None else counted @ grad
            grad = grad.to(dtype)
            if keep is not None:  # uncounted rows: no gradient, for features (rows) or weight (x rows)
                x = x * keep[start : start + rows].unsqueeze(1).to(dtype)
                grad_features[start : start + rows] = (grad @ w) * keep[start : start + rows].unsqueeze(1)
            else:
                grad_features[start : start + rows] = grad @ w
            if grad_weight.dtype == dtype:
                grad_weight.addmm_(grad.T, x)
            else:
                grad_weight += grad.T @ x
    return loss, nll, grad_features, grad_weight, None if grad_bias is None else grad_bias.to(bias.dtype)


class _ProjectedLoss(torch.autograd.Function):
    """The fused projection + loss of [`projected_label_smoothed_nll`][attnx.components.loss.projected_label_smoothed_nll]; gradients computed forward."""

    @staticmethod
    def forward(
        ctx,
        features: Tensor,
        weight: Tensor,
        target: Tensor,
        epsilon: float,
        rows: int,
        keep: Tensor | None,
        bias: Tensor | None,
    ):
        loss, nll, grad_features, grad_weight, grad_bias = _chunked(
            features, weight, target, epsilon, rows, True, keep, bias
        )
        ctx.save_for_backward(grad_features, grad_weight, grad_bias)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        grad_features, grad_weight, grad_bias = ctx.saved_tensors
        bias = None if grad_bias is None else grad_bias * grad_loss
        return grad_features * grad_loss, grad_weight * grad_loss, None, None, None, None, bias


def translation_loss(model: TranslationModel, batch: Batch, epsilon: float) -> LossSums:
    """[`label_smoothed_nll`][attnx.components.loss.label_smoothed_nll] of `model` on `batch` (teacher forcing), the fused way.

    Only the counted target positions are projected onto the vocabulary (padding is dropped from the
    `(B, T, D)` decoder output first), and the projection is fused with the loss
    ([`projected_label_smoothed_nll`][attnx.components.loss.projected_label_smoothed_nll]): the `V`-wide part is the costliest of a small model's step.
    """
    return LabelSmoothedLoss(epsilon)(model, batch)


class LabelSmoothedLoss:
    """`label_smoothed`: §5.4 label-smoothed cross-entropy, projection fused with the loss (what trains).

    Args:
        epsilon: ε_ls (the paper: 0.1).
        chunk_rows: Target positions per chunk of the fused projection; None picks it per device
            ([`projected_label_smoothed_nll`][attnx.components.loss.projected_label_smoothed_nll]).
    """

    def __init__(self, epsilon: float = 0.1, chunk_rows: int | None = None) -> None:
        _check(epsilon)
        self.epsilon = epsilon
        self.chunk_rows = optional_integer(
            "model.loss.args.chunk_rows", chunk_rows, what="target positions per chunk"
        )

    def __call__(self, model: TranslationModel, batch: Batch) -> LossSums:
        memory = model.encode(batch.src, batch.src_mask)  # (B, S, D)
        return self.score(model, batch, model.decode_features(batch.tgt_in, memory, batch.src_mask))

    def score(self, model: TranslationModel, batch: Batch, features: Tensor) -> LossSums:
        """The loss of `batch` from the decoder's output `features` `(B, T, D)`."""
        counted = batch.tgt_positions  # index_select, not features[tgt_mask]: no wait for the GPU
        # all B·T positions passed (a captured step's fixed shape): those whose target is padding count nothing
        every = len(counted) == batch.tgt_out.numel()
        return projected_label_smoothed_nll(
            features.flatten(0, 1).index_select(0, counted),
            model.output_weight,
            batch.tgt_out.flatten().index_select(0, counted),
            self.epsilon,
            self.chunk_rows,
            ignore_index=model.pad_id if every else None,
            bias=getattr(model, "output_bias", None),
        )


class ReferenceLoss:
    """`reference`: the same loss computed plainly from the full `(B, T, V)` logits.

    Args:
        epsilon: ε_ls (the paper: 0.1).
    """

    def __init__(self, epsilon: float = 0.1) -> None:
        _check(epsilon)
        self.epsilon = epsilon

    def __call__(self, model: TranslationModel, batch: Batch) -> LossSums:
        logits = model(batch.src, batch.tgt_in, batch.src_mask)  # (B, T, V)
        return label_smoothed_nll(logits, batch.tgt_out, self.epsilon, ignore_index=model.pad_id)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_loss("label_smoothed", LabelSmoothedLoss)
    registry.add_loss("reference", ReferenceLoss)
