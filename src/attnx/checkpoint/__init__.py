"""The checkpoint: what one holds, reading and writing it, and averaging several of one run.

[`attnx.checkpoint.format`][attnx.checkpoint.format] defines the file (a Lightning checkpoint that also
carries the model config and the SentencePiece model) and reads, rebuilds and writes it;
[`attnx.checkpoint.average`][attnx.checkpoint.average] averages checkpoints (§6.1);
[`attnx.checkpoint.legacy`][attnx.checkpoint.legacy] brings checkpoints of an earlier layout to today's. All are
imported from here: `from attnx.checkpoint import load_model, average_checkpoints`.
"""

from __future__ import annotations

from attnx.checkpoint.average import TRAINING_STATE, average_checkpoints, checkpoint_step, last_checkpoints
from attnx.checkpoint.format import (
    FORMAT_VERSION,
    STATE_PREFIX,
    CheckpointError,
    LoadedModel,
    atomic_copy,
    atomic_save,
    atomic_write,
    check_tokenizer,
    config_difference,
    load_model,
    make_metadata,
    model_state,
    read_checkpoint,
    save_model,
    tensor_bytes,
    tokenizer_sha256,
)
from attnx.checkpoint.legacy import upgrade_checkpoint
from attnx.files import TEMPORARY_SUFFIX, remove_stale_temporaries

__all__ = [
    "FORMAT_VERSION",
    "STATE_PREFIX",
    "TEMPORARY_SUFFIX",
    "TRAINING_STATE",
    "CheckpointError",
    "LoadedModel",
    "atomic_copy",
    "atomic_save",
    "atomic_write",
    "average_checkpoints",
    "check_tokenizer",
    "checkpoint_step",
    "config_difference",
    "last_checkpoints",
    "load_model",
    "make_metadata",
    "model_state",
    "read_checkpoint",
    "remove_stale_temporaries",
    "save_model",
    "tensor_bytes",
    "tokenizer_sha256",
    "upgrade_checkpoint",
]
