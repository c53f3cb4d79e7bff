"""attnx beside two other PyTorch implementations of the same model, trained on the same batches in one run
(``bench_gpu.py --peers``): the ratio, not a figure from elsewhere.

* **attnx**: the model ``build_transformer`` makes, the loss ``TranslationTask`` trains with
  (``translation_loss``: label smoothing 0.1, only real target positions projected);
* **Marian**: Hugging Face ``MarianMTModel`` built from a ``MarianConfig`` with attnx's dimensions (d_model,
  heads, FFN width, layers, vocabulary, dropout on sub-layers only, ReLU, post-norm, embeddings scaled by
  √d_model, one matrix for both embeddings and the output), attention through PyTorch's SDPA
  (``attn_implementation="sdpa"``), its logits over every target position into ``F.cross_entropy`` with
  ``label_smoothing=0.1``, padding ignored: what a user of ``transformers`` writes;
* **nn.Transformer**: ``torch.nn.Transformer`` (batch first, post-norm, its own final LayerNorms) between a
  shared embedding scaled by √d_model plus the paper's sinusoids, with the embedding as output projection,
  the same loss as Marian's.

Every system gets the same batches from attnx's loader, the same autocast precision, fused AdamW and the same
timed loop as ``bench_gpu.py``'s rows (``gpu_timing.timed_steps``: the loss read back once per optimizer step,
as ``attnx fit`` does). Attention on CUDA runs with
cuDNN's kernel left out for all three (``attention_backends``: the kernels the others would choose by
default are PyTorch's, the cause of attnx's choice is PyTorch's too). Rounds alternate the order (attnx,
Marian, nn.Transformer; then reversed), since the first run of a kernel configuration in a process pays for
loading it; every round is reported, the last is the one to quote. MFU counts the paper model's FLOPs for
every system (``training_flops_per_token``), so the three share one numerator per token: work the others do
beyond it (logits of padded positions) costs them time, not credit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from gpu_timing import Timed, adamw, autocast, timed_steps
from harness import markdown_table
from torch import Tensor, nn

from attnx.components.attention import attention_backends
from attnx.components.loss import translation_loss
from attnx.components.positional import sinusoid_table
from attnx.data.batch import PAD_ID, Batch
from attnx.export.huggingface import marian_config
from attnx.model import TransformerConfig, build_transformer

LABEL_SMOOTHING = 0.1
SYSTEMS = ("attnx", "Marian", "nn.Transformer")


def marian(config: TransformerConfig) -> nn.Module:
    """Hugging Face's ``MarianMTModel`` with ``config``'s dimensions (the config `attnx export --format
    huggingface` writes) and SDPA attention."""
    from transformers import MarianMTModel

    hf = marian_config(config)
    hf._attn_implementation = "sdpa"
    model = MarianMTModel(hf)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"MarianMTModel runs {model.config._attn_implementation!r} attention, not sdpa")
    return model


def marian_loss(model: nn.Module, batch: Batch) -> Tensor:
    logits = model(input_ids=batch.src, attention_mask=batch.src_mask, decoder_input_ids=batch.tgt_in).logits
    return label_smoothed_sum(logits, batch.tgt_out)  # (B, T, V) over every position


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with a shared, √d_model-scaled embedding, the paper's sinusoids and the
    embedding matrix as output projection."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, d, padding_idx=PAD_ID)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        self.register_buffer("positions", sinusoid_table(config.max_len, d).float(), persistent=False)
        self.transformer = nn.Transformer(
            d,
            config.n_heads,
            config.encoder_layers,
            config.decoder_layers,
            config.d_ff,
            config.dropout,
            batch_first=True,
        )
        self.scale, self.dropout = math.sqrt(d), config.dropout

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens) * self.scale + self.positions[: tokens.shape[1]]  # (B, T, D)
        return F.dropout(x, self.dropout, self.training)

    def forward(self, batch: Batch) -> Tensor:
        t = batch.tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=batch.tgt_in.device)
        padding = ~batch.src_mask  # (B, S) True = padding, as torch's modules take it
        out = self.transformer(
            self.embed(batch.src),
            self.embed(batch.tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=padding,
            memory_key_padding_mask=padding,
            tgt_is_causal=True,
        )
        return F.linear(out, self.embedding.weight)  # (B, T, V)


def torch_transformer_loss(model: nn.Module, batch: Batch) -> Tensor:
    return label_smoothed_sum(model(batch), batch.tgt_out)


def label_smoothed_sum(logits: Tensor, target: Tensor) -> Tensor:
    """Label-smoothed cross-entropy summed over real target tokens (autocast runs it in fp32)."""
    return F.cross_entropy(
        logits.flatten(0, 1),
        target.flatten(),
        ignore_index=PAD_ID,
        label_smoothing=LABEL_SMOOTHING,
        reduction="sum",
    )


def attnx_loss(model: nn.Module, batch: Batch) -> Tensor:
    return translation_loss(model, batch, LABEL_SMOOTHING).loss


BUILDERS: dict[str, tuple[Callable[[TransformerConfig], nn.Module], Callable[[nn.Module, Batch], Tensor]]] = {
    "attnx": (build_transformer, attnx_loss),
    "Marian": (marian, marian_loss),
    "nn.Transformer": (TorchTransformer, torch_transformer_loss),
}


@dataclass
class PeerResult:
    """One system's round: what it trained and what the timed loop counted."""

    system: str
    model: str
    precision: str
    max_tokens: int
    accumulate: int
    round: int
    parameters: int = 0
    timed: Timed = field(default_factory=Timed)
    error: str | None = None


def peer_rounds(
    name: str,
    config: TransformerConfig,
    batches: list[Batch],
    precision: str,
    max_tokens: int,
    acc: int,
    warmup: int,
    rounds: int,
    device: torch.device,
) -> list[PeerResult]:
    """Every system trained on ``batches`` ``rounds`` times, the order reversed every other round."""
    systems: dict[str, tuple[nn.Module, Callable, torch.optim.Optimizer]] = {}
    for system in SYSTEMS:
        build, loss_fn = BUILDERS[system]
        torch.manual_seed(0)
        model = build(config).to(device)
        systems[system] = (model, loss_fn, adamw(model))

    results = []
    for number in range(1, rounds + 1):
        order = SYSTEMS if number % 2 else SYSTEMS[::-1]
        for system in order:
            model, loss_fn, optimizer = systems[system]
            result = PeerResult(system, name, precision, max_tokens, acc, number)
            result.parameters = sum(p.numel() for p in model.parameters())

            def micro(batch: Batch, model: nn.Module = model, loss_fn: Callable = loss_fn) -> Tensor:
                with autocast(device, precision), attention_backends(batch.src):
                    loss = loss_fn(model, batch) / batch.n_tgt_tokens
                (loss / acc).backward()
                return loss.detach()

            model.train()
            try:
                timed_steps(result.timed, config, batches, acc, warmup, micro, optimizer, device)
            except torch.OutOfMemoryError as e:
                result.error = f"out of memory: {str(e).splitlines()[0]}"
            except Exception as e:  # report it, go on with the others
                result.error = (
                    f"{result.system}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                )
            results.append(result)
    return results


def peer_table(results: list[PeerResult], peak: float, device_name: str) -> str:
    """One row per system and round; each row's target tokens/s also as a multiple of attnx's that round."""
    attnx = {
        (r.model, r.precision, r.max_tokens, r.round): r.timed.rates(peak)["target_tokens_per_s"]
        for r in results
        if r.system == "attnx" and r.error is None
    }
    header = ["device", "model", "precision", "max_tokens × acc", "round", "system", "params (M)",
              "tgt tokens/s (wps)", "tokens/s (src+tgt)", "ms/step", "MFU", "÷ attnx", "loss first → last"]  # fmt: skip
    rows = []
    for r in results:
        cells = [device_name, r.model, r.precision, f"{r.max_tokens} × {r.accumulate}", r.round, r.system,
                 f"{r.parameters / 1e6:.1f}"]  # fmt: skip
        if r.error:
            rows.append(cells + [r.error] + [""] * (len(header) - len(cells) - 1))
            continue
        rate, losses = r.timed.rates(peak), r.timed.losses
        ours = attnx.get((r.model, r.precision, r.max_tokens, r.round))
        rows.append(cells + [f"{rate['target_tokens_per_s']:,.0f}", f"{rate['tokens_per_s']:,.0f}",
                             f"{rate['ms_per_step']:,.0f}", f"{rate['mfu']:.1%}",
                             f"{rate['target_tokens_per_s'] / ours:.2f}" if ours else "",
                             f"{losses[0]:.2f} → {losses[-1]:.2f}" if losses else ""])  # fmt: skip
    return markdown_table(header, rows)


def peer_record(result: PeerResult, peak: float, info: dict[str, Any]) -> dict[str, Any]:
    """A round's record for ``--json``: its settings, counts and rates (none after an error), the machine."""
    own = {k: v for k, v in asdict(result).items() if k != "timed"}
    return own | asdict(result.timed) | ({} if result.error else result.timed.rates(peak)) | {"machine": info}


def run_peers(args: Any, configs: dict[str, TransformerConfig], batches_for: Callable[[int, int], list[Batch]],
              accumulation: Callable[[int], int], device: torch.device, peak: float, info: dict[str, Any], where: str,
              measured: Callable[[dict[str, Any]], Any] = lambda record: record) -> list[dict[str, Any]]:  # fmt: skip
    """``bench_gpu.py --peers``: the rounds of every model, precision and ``--max_tokens``, printed as they
    finish, then as one table under the device line; the records for ``--json``, each given to ``measured`` as
    soon as its configuration's rounds are done."""
    print(f"## attnx and its peers on the same batches ({args.peer_rounds} rounds, order reversed every "
          f"other round; quote the last)\n{where}\n", flush=True)  # fmt: skip
    results: list[PeerResult] = []
    records: list[dict[str, Any]] = []
    for max_tokens in args.max_tokens:
        acc = accumulation(max_tokens)
        batches = batches_for(max_tokens, (args.warmup + args.steps) * acc)
        for name, config in configs.items():
            for precision in args.precision:
                done = peer_rounds(name, config, batches, precision, max_tokens, acc, args.warmup, args.peer_rounds,
                                   device)  # fmt: skip
                print(peer_table(done, peak, info["device_name"]), flush=True)
                records += [measured(peer_record(r, peak, info)) for r in done]
                results += done
        del batches
    if len(results) > args.peer_rounds * len(SYSTEMS):  # more than one configuration: all of them together
        print(f"\n{peer_table(results, peak, info['device_name'])}", flush=True)
    print(f"{where}\n", flush=True)
    return records
