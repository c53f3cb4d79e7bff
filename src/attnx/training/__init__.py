"""Training: the LightningModule, its loss and learning-rate schedule, checkpoints and the `attnx fit` CLI.

Search, averaging and BLEU never need this package; this package is where Lightning lives.
"""

from attnx.training.loss import LossSums, label_smoothed_nll
from attnx.training.schedule import inverse_sqrt_schedule

__all__ = ["LossSums", "inverse_sqrt_schedule", "label_smoothed_nll"]
