"""Training: the LightningModule, its learning-rate schedule, checkpoints and the `attnx fit` CLI.

The loss is a registered component (`attnx.components.loss`); `LossSums` and `label_smoothed_nll` are
re-exported here.

Search, averaging and BLEU never need this package; this package is where Lightning lives.
"""

from attnx.components.loss import LossSums, label_smoothed_nll
from attnx.training.schedule import inverse_sqrt_schedule

__all__ = ["LossSums", "inverse_sqrt_schedule", "label_smoothed_nll"]
