"""Fine-tuning with LoRA adapters (config section `lora`): Eole's `lora_layers`, HF PEFT's LoRA.

`attnx fit --init_from general.ckpt --lora.rank 8` freezes every weight of the model and trains only low-rank
adapters ([`attnx.model.lora`][attnx.model.lora]) on the chosen projections of the chosen layers: the optimizer
holds the adapters' moments only, and no second copy of the model exists. Every checkpoint holds the merged
weights `W + (alpha / r) · B A` as its model weights, so `attnx average`, `attnx export`, `attnx serve` and
`attnx translate` read it as any checkpoint; the frozen weights of the adapted projections and the adapters
travel beside them (`attnx_lora`) and a resumed run continues exactly.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import nn

from attnx.errors import ConfigError
from attnx.model.lora import (
    PROJECTIONS,
    adapted,
    adapter_parameters,
    adapter_targets,
    add_adapters,
    check_lora,
)
from attnx.training.ema import WeightEMA

LORA_KEY = "attnx_lora"
"""The checkpoint entry of a LoRA run: `{"rank", "alpha", "base", "adapters"}`, by state-dict key."""


class LowRankAdapters(Callback):
    """Train LoRA adapters on chosen projections, the rest of the model frozen."""

    def __init__(
        self,
        rank: int | None = None,
        alpha: float = 16.0,
        projections: list[str] | None = None,
        layers: list[str] | None = None,
    ) -> None:
        """
        Args:
            rank: The adapters' rank r (8 or 16 are usual). None (the default): no adapters, every weight
                trains.
            alpha: The adapters' scale is alpha / rank (the LoRA paper's α).
            projections: Which projections get adapters, among `in_proj` (attention's W^Q, W^K, W^V), `out_proj`
                (W^O), `w1` and `w2` (the feed-forward layers; a gated one's are `w`, `v` and `w2`). Default:
                `in_proj` and `out_proj`.
            layers: Glob patterns over the layers' names, `encoder_layers.N` and `decoder_layers.N`: e.g.
                `[decoder_layers.*]` for the decoder alone. Default: every layer.
        """
        self.rank = rank
        self.alpha = alpha
        self.projections = list(projections or ["in_proj", "out_proj"])
        self.layers = list(layers or ["*"])
        if rank is not None:
            check_lora(rank, alpha)
        unknown = sorted(set(self.projections) - set(PROJECTIONS))
        if unknown:
            raise ConfigError(f"lora.projections {unknown} unknown; choose among {list(PROJECTIONS)}")

    def parameters(self, model: nn.Module) -> tuple[int, int | None]:
        """`(all parameters, trainable ones)` of `model` once this run's adapters are on it (they are added when
        fit starts); trainable None when every weight trains (no rank)."""
        total = sum(p.numel() for p in model.parameters())
        if self.rank is None:
            return total, None
        if adapted(model):
            return total, sum(p.numel() for p in model.parameters() if p.requires_grad)
        names = adapter_targets(model, self.projections, self.layers)
        adapters = adapter_parameters(model, names, self.rank)
        return total + adapters, adapters

    @property
    def state_key(self) -> str:
        return "LowRankAdapters"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self.rank is None:
            return
        if any(isinstance(c, WeightEMA) and c.decay is not None for c in trainer.callbacks):
            raise ConfigError("lora and ema together are not supported: leave out --ema.decay or --lora.rank")
        names = adapter_targets(pl_module.model, self.projections, self.layers)
        add_adapters(pl_module.model, names, self.rank, self.alpha)
        pl_module.strict_loading = (
            False  # a checkpoint holds merged weights: on_load_checkpoint sorts them out
        )
        trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        total = sum(p.numel() for p in pl_module.parameters())
        if trainer.is_global_zero:
            print(
                f"lora: rank {self.rank}, alpha {self.alpha:g} on {len(names)} projections "
                f"({', '.join(self.projections)} of layers {', '.join(self.layers)}); {trainable:,} trainable "
                f"parameters of {total:,}, the rest frozen",
                flush=True,
            )

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        modules = adapted(pl_module)
        if not modules:
            return
        state = checkpoint["state_dict"]
        base, adapters = {}, {}
        for name, module in modules.items():
            prefix = f"{name}.parametrizations.weight"
            base[f"{name}.weight"] = state.pop(f"{prefix}.original")
            for part in ("lora_A", "lora_B"):
                adapters[f"{prefix}.0.{part}"] = state.pop(f"{prefix}.0.{part}")
            state[f"{name}.weight"] = module.weight.detach().clone()  # merged: what every reader decodes with
        checkpoint[LORA_KEY] = {"rank": self.rank, "alpha": self.alpha, "base": base, "adapters": adapters}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A resumed fit: the adapted projections take their frozen weights and adapters from the checkpoint
        (Lightning loaded the other weights)."""
        if trainer.state.fn != "fit":
            return
        stored = checkpoint.get(LORA_KEY)
        if self.rank is None:
            if stored is not None:
                raise ConfigError(
                    f"{trainer.ckpt_path} is of a LoRA run (rank {stored['rank']}): resume it with --lora.rank "
                    f"{stored['rank']}, or start a new run from its merged weights with --init_from"
                )
            return
        if stored is None or stored["rank"] != self.rank:
            raise ConfigError(
                f"--lora.rank {self.rank}: {trainer.ckpt_path} is not of a LoRA run of that rank; resume it as it "
                "was trained, or start a LoRA run from its weights with --init_from"
            )
        asked = {f"{name}.weight" for name in adapted(pl_module)}
        if asked != set(stored["base"]):
            raise ConfigError(
                f"--ckpt_path {trainer.ckpt_path}: its adapters are on {adapter_places(stored['base'])}, this run "
                f"asks for {adapter_places(asked)}: resume with the run's lora.projections and lora.layers, or "
                "start a new LoRA run from its merged weights with --init_from"
            )
        own = pl_module.state_dict(keep_vars=True)
        for name in adapted(pl_module):
            prefix = f"{name}.parametrizations.weight"
            own[f"{prefix}.original"].data.copy_(stored["base"][f"{name}.weight"])
            for part in ("lora_A", "lora_B"):
                own[f"{prefix}.0.{part}"].data.copy_(stored["adapters"][f"{prefix}.0.{part}"])


def adapter_places(keys: Any) -> str:
    """What the state-dict keys of adapted weights (`model.decoder_layers.0.self_attn.in_proj.weight`) name, in
    a few words: `in_proj, out_proj of decoder_layers.0, decoder_layers.1 (4 projections)`."""
    parts = [key.removeprefix("model.").removesuffix(".weight").split(".") for key in keys]
    projections = sorted({p[-1] for p in parts})
    layers = sorted(  # the encoder's first, each stack's in order
        {(p[0], int(p[1])) for p in parts if len(p) > 2 and p[1].isdigit()},
        key=lambda layer: (layer[0] != "encoder_layers", layer),
    )
    where = ", ".join(f"{stack}.{index}" for stack, index in layers)
    return f"{', '.join(projections)} of {where} ({len(parts)} projections)"


def random_weights_line(rank: int | None, init_from: str | None, ckpt_path: str | None) -> str | None:
    """The warning of a LoRA fit that starts neither from trained weights (`--init_from`) nor from a LoRA run
    (`--ckpt_path`): its adapters would train over a frozen, randomly initialised model. None elsewhere."""
    if rank is None or init_from or ckpt_path:
        return None
    return (
        f"lora.rank {rank} without --init_from: the adapters train over a frozen, randomly initialised model; "
        "pass --init_from CHECKPOINT to fine-tune trained weights"
    )
