"""A callback that records what each DDP rank did, for multi-process tests to compare ranks with.

Added to a real ``attnx fit`` on the command line: ``--trainer.callbacks+=tests.training.ddp_probe.RankProbe
--trainer.callbacks.output DIR``; rank R writes ``DIR/rank_R.json``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


def digest(values: Any) -> str:
    """SHA-256 of tensors (a state dict, a list, one tensor), by their bytes in order."""
    sha = hashlib.sha256()
    items = (
        values.items()
        if isinstance(values, dict)
        else enumerate(values if isinstance(values, list) else [values])
    )
    for key, tensor in items:
        sha.update(str(key).encode())
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()


class RankProbe(Callback):
    """Per rank: world size, optimizer steps taken, each epoch's batch numbers (its shard of the batch plan),
    a digest of every training batch, and a digest of the weights training ended with."""

    def __init__(self, output: str) -> None:
        self.output = Path(output)
        self.record: dict[str, Any] = {"steps": [], "batches": [], "shards": {}}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx
    ):
        self.record["steps"].append(trainer.global_step)
        self.record["batches"].append(digest([batch.src, batch.tgt_out]))
        sampler = trainer.datamodule.train_sampler
        self.record["shards"][str(sampler.epoch)] = [int(k) for k in sampler.batch_order()]
        self.record["num_batches"] = sampler.num_batches

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.record.update(
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            num_nodes=trainer.num_nodes,
            weights=digest(pl_module.model.state_dict()),
        )
        self.output.mkdir(parents=True, exist_ok=True)
        (self.output / f"rank_{trainer.global_rank}.json").write_text(json.dumps(self.record))


def read_ranks(output: Path, world_size: int) -> list[dict[str, Any]]:
    records = [json.loads((output / f"rank_{rank}.json").read_text()) for rank in range(world_size)]
    assert [r["rank"] for r in records] == list(range(world_size))
    assert all(r["world_size"] == world_size for r in records)
    return records


def assert_ranks_agree(records: list[dict[str, Any]], steps: int) -> None:
    """Same optimizer steps, same final weights, disjoint shards of every batch plan, different batches."""
    for record in records:
        assert record["steps"] == list(range(1, steps + 1)), record["steps"]
    assert len({r["weights"] for r in records}) == 1, "weights differ across ranks"
    n, plan = len(records), records[0]["num_batches"]
    for epoch in records[0]["shards"]:
        shards = [r["shards"][epoch] for r in records]
        assert len({len(shard) for shard in shards}) == 1  # every rank the same number of batches
        together = [k for shard in shards for k in shard]
        assert set(together) == set(range(plan)), f"epoch {epoch}: the shards miss batches"
        assert len(together) - plan == (-plan) % n, f"epoch {epoch}: shards overlap beyond the padding"
    for step in range(steps):
        assert len({r["batches"][step] for r in records}) == len(records), (
            f"two ranks trained on one batch at {step}"
        )
