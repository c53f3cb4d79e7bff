"""fit's first lines: the estimate read off a trainer, a model and the data."""

from __future__ import annotations

from pathlib import Path

import torch

from attnx.training.fit_estimate import fit_estimate_lines
from tests.conftest import tiny_config


def test_a_resumed_run_is_estimated_for_what_is_left_and_a_run_without_validation_says_so(
    corpus: Path,
) -> None:
    """Resumed at step 147 with 8 of its 30 minutes used (Lightning restores the timer only once training
    starts): the estimate is for the 22 minutes left. A run that ends before its first validation says so,
    with the option that changes it."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Timer

    from attnx.data.corpus import PreparedCorpus
    from attnx.model import build_transformer

    prepared = PreparedCorpus(corpus)
    config = tiny_config(vocab_size=prepared.vocab_size)
    module = SimpleNamespace(config=config, model=build_transformer(config))
    data = SimpleNamespace(corpus=prepared, train_split="train", max_tokens=512, eval_max_tokens=512)
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        precision="32-true",
        accumulate_grad_batches=1,
        max_steps=-1,
        callbacks=[Timer(duration="00:00:30:00")],
        val_check_interval=10**9,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    lines = fit_estimate_lines(trainer, module, data, resumed_step=147, trained_seconds=480)
    assert ", 0:22:00 for " in lines[1] and " steps after step 147 (max_time)" in lines[1]
    assert lines[2].startswith("no validation in this run: it ends after about ")
    assert (
        "before its first validation at 1,000,000,000 (trainer.val_check_interval); --trainer.val_check_interval"
        in lines[2]
    )
    trainer.val_check_interval = 4
    assert len(fit_estimate_lines(trainer, module, data)) == 2


def test_under_lora_only_the_adapters_have_gradients_and_adam_moments(corpus: Path) -> None:
    """fit estimates before LoRA's callback puts the adapters on: they are counted as the model will have them
    (its frozen weights once, the adapters' gradients and Adam's moments alone)."""
    import copy
    from types import SimpleNamespace

    from attnx.data.corpus import PreparedCorpus
    from attnx.model import build_transformer
    from attnx.model.lora import adapter_targets, add_adapters
    from attnx.training.lora import LowRankAdapters

    prepared = PreparedCorpus(corpus)
    config = tiny_config(vocab_size=prepared.vocab_size)
    module = SimpleNamespace(config=config, model=build_transformer(config))
    data = SimpleNamespace(corpus=prepared, train_split="train", max_tokens=512, eval_max_tokens=512)
    lora = LowRankAdapters(rank=4, projections=["in_proj", "w2"], layers=["decoder_layers.*"])
    trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        precision="32-true",
        accumulate_grad_batches=1,
        max_steps=10,
        callbacks=[lora],
        val_check_interval=4,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    adapted = copy.deepcopy(module.model)
    add_adapters(adapted, adapter_targets(adapted, lora.projections, lora.layers), 4, 16.0)
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    total = sum(p.numel() for p in adapted.parameters())
    assert 0 < trainable < total / 10
    memory = fit_estimate_lines(trainer, module, data)[0]
    assert f"of the {trainable:,} trainable parameters of {total:,}" in memory
    assert lora.parameters(adapted) == (total, trainable)  # the same once the adapters are on
    trainer.callbacks = []
    assert "trainable" not in fit_estimate_lines(trainer, module, data)[0]
