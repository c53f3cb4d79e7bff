"""The realized mix of weighted training corpora (`data.corpus_weights`, `data.sampling_temperature`), logged.

`train/mix/<name>` is each corpus's share of the training pairs seen so far in the run, `train/mix_tokens/<name>`
its share of their real (source + target) tokens, on this rank (DDP ranks draw alike). The counts are kept in
checkpoints, so a resumed run continues them. `attnx fit` adds this callback; it logs nothing without a mix.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from attnx.data.batch import Batch
from attnx.data.mixing import CorpusMix
from attnx.training.host_syncs import log_host


class CorpusMixLog(Callback):
    """Log each training corpus's share of the pairs and tokens trained on (see the module's description)."""

    def __init__(self) -> None:
        self.mix: CorpusMix | None = None
        self.pairs: dict[str, int] = {}
        self.tokens: dict[str, int] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.mix = getattr(trainer.datamodule, "corpus_mix", None)
        if self.mix is not None:
            for corpus in self.mix.corpora:
                self.pairs.setdefault(corpus.name, 0)
                self.tokens.setdefault(corpus.name, 0)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Batch, batch_idx: int
    ) -> None:
        if self.mix is None or batch.index is None or not len(batch.index):
            return
        # a batch holds pairs of one corpus; its index stays on the host (Batch.to)
        name = self.mix.corpora[self.mix.corpus_of(int(batch.index[0]))].name
        self.pairs[name] = self.pairs.get(name, 0) + batch.size
        self.tokens[name] = self.tokens.get(name, 0) + batch.n_src_tokens + batch.n_tgt_tokens
        pairs, tokens = sum(self.pairs.values()), sum(self.tokens.values())
        for corpus in self.mix.corpora:
            log_host(pl_module, f"train/mix/{corpus.name}", self.pairs.get(corpus.name, 0) / pairs)
            log_host(pl_module, f"train/mix_tokens/{corpus.name}", self.tokens.get(corpus.name, 0) / tokens)

    def state_dict(self) -> dict[str, Any]:
        return {"pairs": dict(self.pairs), "tokens": dict(self.tokens)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pairs = dict(state_dict.get("pairs", {}))
        self.tokens = dict(state_dict.get("tokens", {}))
