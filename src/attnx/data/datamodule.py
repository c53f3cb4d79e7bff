"""The Lightning side of the data pipeline: a prepared corpus → token-budget batches of
[`Batch`][attnx.data.batch.Batch]."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from functools import cached_property
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from attnx.data.batching import BatchDataset, TokenBatchSampler, no_collate
from attnx.data.corpus import PreparedCorpus
from attnx.data.mixing import CorpusMix, MixedBatchSampler, MixedEpochBatchSampler, corpus_mix
from attnx.data.sampling import (
    NO_SAMPLING,
    EpochBatchSampler,
    SampledBatches,
    SubwordSampling,
    headroom,
    planned_lengths,
)
from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError

AUTO_SHAPE_BUCKETS = 8
"""The multiple `shape_buckets: null` pads to where fewer shapes pay (bf16/fp16, GPUs)."""


PLAN_OPTIONS = ("max_tokens", "seed", "shape_buckets", "corpus_weights", "sampling_temperature")
"""The options of the data module that decide the training batches of an epoch (besides the corpus)."""


def auto_shape_buckets(precision: str, on_gpu: bool) -> int:
    """`shape_buckets: null` resolved: [`AUTO_SHAPE_BUCKETS`][attnx.data.datamodule.AUTO_SHAPE_BUCKETS] on a GPU
    or in a 16-bit precision (`bf16-mixed`, `16-mixed`, ...), 0 (off) for fp32 on CPU."""
    return AUTO_SHAPE_BUCKETS if on_gpu or str(precision).startswith(("bf16", "16")) else 0


class TranslationDataModule(L.LightningDataModule):
    """Batches of a corpus written by `attnx prepare`, grouped by length within a token budget (§5.1).

    Training batches hold at most `max_tokens` source and at most `max_tokens` target tokens, padding and
    EOS/BOS included. They are fixed for a `seed` and visited in a new seeded order each epoch, identical on
    every run with the same seed. Under DDP each rank gets different batches and all ranks the same number
    (the list is padded by repeating batches). The position in the epoch is saved in checkpoints
    ([`state_dict`][attnx.data.datamodule.TranslationDataModule.state_dict]), so a run resumed mid-epoch
    continues with the very next batch. (Lightning still warns that the dataloader "is not resumable" when
    resuming mid-epoch: it only knows of resumable dataloaders, not of a DataModule that restores its
    sampler.)

    Validation, test and predict batches are sorted by length, in a fixed order, each pair exactly once and
    carrying `Batch.index` (its line in the split) to restore corpus order. They are not sharded: under DDP every
    rank iterates the whole split, so metrics are exact and equal on all ranks (decode a test set on rank 0 alone,
    or on one device, to write its translations once).

    Args:
        data_dir: directory written by `attnx prepare`.
        max_tokens: padded tokens per side in a training batch, per device (the paper: about 25,000 per step over 8 GPUs).
        eval_max_tokens: the same for validation/test/predict batches; default `max_tokens`.
        seed: seeds the batches' composition and their order in each epoch.
        num_workers: DataLoader worker processes; 0 gathers and pads batches in the training process.
        pin_memory: Copy each batch into page-locked host memory in the loader's pinning thread, so that its
            copy to a CUDA device is asynchronous and overlaps the computation (`Batch.to` copies to CUDA
            with `non_blocking`). None: pin when the trainer runs on a CUDA device (without a trainer, when
            CUDA is available); never on CPU, where pinning has nothing to gain.
        train_split: split name used for training.
        valid_split: split name used for validation.
        test_split: split name used for test and predict.
        shape_buckets: Pad training batches to a few lengths so that an epoch uses a few dozen tensor shapes
            ([`LengthBuckets`][attnx.data.batching.LengthBuckets]): N rounds lengths up to multiples of N
            (then 8 steps per doubling), 0 pads each batch to its longest pair only. None (the default): 8
            where the trainer runs in bf16/fp16 or on a GPU, where kernels are built per shape (oneDNN's bf16
            kernels, tensor cores, `torch.compile`); 0 for fp32 on CPU, which gains nothing from fewer shapes
            and would pay for the extra padding (docs/benchmarks.md). The first line of `attnx fit` says how many
            shapes an epoch has and how much of it is padding.
        subword_sampling: Segment the training pairs anew each epoch with SentencePiece's sampling
            (BPE-dropout; [`SubwordSampling`][attnx.data.sampling.SubwordSampling]): `alpha` 0 (the default)
            keeps the prepared segmentation. The batches keep their plan and shapes; validation, test and predict
            keep the prepared segmentation.
        corpus_weights: Mix the named training corpora of the prepared folder (`attnx prepare --train NAME=PREFIX
            ...`) by weight, e.g. `{europarl: 1, news: 3}`: each corpus's share of the training pairs is its
            weight over the sum (times its size^(1/T) with `sampling_temperature`); 0 leaves a corpus out. Every
            corpus needs a weight. Batches stay length-sorted within one corpus; an epoch holds as many batches
            as one pass over the corpora taking part ([`attnx.data.mixing`][attnx.data.mixing]). None (the
            default): each pair once an epoch.
        sampling_temperature: Draw corpus i with share ∝ (n_i/N)^(1/T) of its pairs n_i (multilingual NMT's
            temperature sampling): 1 keeps the natural proportions, 5 flattens them toward equal shares.
            Combined with `corpus_weights`, the weights multiply these shares. None: no temperature.
    """

    def __init__(
        self,
        data_dir: str,
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        seed: int = 1,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        train_split: str = "train",
        valid_split: str = "valid",
        test_split: str = "test",
        shape_buckets: int | None = None,
        subword_sampling: SubwordSampling = NO_SAMPLING,
        corpus_weights: dict[str, float] | None = None,
        sampling_temperature: float | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if dataclasses.is_dataclass(
            subword_sampling
        ):  # checkpoints load with weights_only=True: plain values
            self.hparams["subword_sampling"] = dataclasses.asdict(subword_sampling)
        self.data_dir = data_dir
        self.max_tokens = max_tokens
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.seed = seed
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.train_split, self.valid_split, self.test_split = train_split, valid_split, test_split
        if shape_buckets is not None and shape_buckets < 0:
            raise ConfigError(
                f"data.shape_buckets must be None, 0 (off) or a positive multiple, not {shape_buckets}"
            )
        self.shape_buckets = shape_buckets
        if isinstance(subword_sampling, dict):  # a checkpoint's plain hyperparameters
            subword_sampling = SubwordSampling(**subword_sampling)
        self.subword_sampling = subword_sampling
        self._corpus = PreparedCorpus(data_dir)
        self.corpus_mix: CorpusMix | None = corpus_mix(
            self._corpus, train_split, corpus_weights, sampling_temperature
        )
        """The training corpora's mix asked by `corpus_weights`/`sampling_temperature`, None without them."""
        self.max_positions: int | None = None
        """The positions the model reads (its `max_len`, `</s>` or `<s>` included): training batches are never
        padded wider, nor sampled segmentations longer. None: those of the trainer's module, read when the
        training batches are first built
        ([`model_positions`][attnx.data.datamodule.TranslationDataModule.model_positions])."""
        self._train_sampler: TokenBatchSampler | None = None
        self._resume: dict[str, Any] | None = None

    @property
    def corpus(self) -> PreparedCorpus:
        return self._corpus

    @property
    def tokenizer(self) -> Tokenizer:
        return self._corpus.tokenizer

    @property
    def vocab_size(self) -> int:
        """The number of pieces of the corpus's SentencePiece model, once `meta.json` records the same
        ([`PreparedCorpus.tokenizer`][attnx.data.corpus.PreparedCorpus.tokenizer]): the model's size."""
        return self.tokenizer.vocab_size

    def setup(self, stage: str) -> None:
        """Check the files of the splits this stage reads against the SHA-256 `meta.json` records, so a damaged
        corpus stops the command before its first step (the validation references included)."""
        splits = {
            "fit": [self.train_split, self.valid_split],
            "validate": [self.valid_split],
        }.get(stage, [self.test_split])
        for split in splits:
            self._corpus.verify_split(split)

    def _world(self) -> tuple[int, int]:
        """(world size, rank) from the trainer, else from `torch.distributed`, else a single process."""
        if self.trainer is not None:
            return self.trainer.world_size, self.trainer.global_rank
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def resolved_shape_buckets(self) -> int:
        """`shape_buckets`, or where it is None: 8 for a trainer in bf16/fp16 or on a GPU, else 0."""
        if self.shape_buckets is not None:
            return self.shape_buckets
        if self.trainer is None:
            return auto_shape_buckets("32-true", torch.cuda.is_available())
        on_gpu = self.trainer.strategy.root_device.type != "cpu"
        return auto_shape_buckets(str(self.trainer.precision), on_gpu)

    def model_positions(self) -> int | None:
        """`max_positions`, or where it is None the positions of the model the trainer trains; None without
        either (no limit but `max_tokens`)."""
        if self.max_positions is not None:
            return self.max_positions
        module = self.trainer.lightning_module if self.trainer is not None else None
        positions = getattr(getattr(module, "model", None), "max_positions", None)
        return int(positions) if positions else None

    @property
    def train_sampler(self) -> TokenBatchSampler:
        """The training batch sampler (built on first use, then kept: it carries the epoch and position)."""
        if self._train_sampler is None:
            dataset = self._corpus.dataset(self.train_split)
            world_size, rank = self._world()
            src_lengths, tgt_lengths, sampler = dataset.src_lengths, dataset.tgt_lengths, TokenBatchSampler
            positions = self.model_positions()
            if self.subword_sampling.enabled:  # planned for the longer sampled segmentations
                sampler, factors = EpochBatchSampler, self.sampling_headroom
                src_lengths, tgt_lengths = (
                    planned_lengths(lengths, factor, self.max_tokens, positions)
                    for lengths, factor in zip((src_lengths, tgt_lengths), factors, strict=True)
                )
            mixed = {} if self.corpus_mix is None else {"mix": self.corpus_mix}
            if mixed:
                sampler = MixedEpochBatchSampler if self.subword_sampling.enabled else MixedBatchSampler
            self._train_sampler = sampler(
                src_lengths,
                tgt_lengths,
                self.max_tokens,
                seed=self.seed,
                shuffle=True,
                num_replicas=world_size,
                rank=rank,
                shape_buckets=self.resolved_shape_buckets(),
                max_positions=positions,
                **mixed,
            )
            if self.subword_sampling.enabled:
                self._train_sampler.sampling_line = (
                    f"{self.subword_sampling.check(self.tokenizer)}; batches planned for source and target "
                    f"segmentations {factors[0]:.2f}x and {factors[1]:.2f}x longer (a side that outgrows its "
                    "batch keeps its prepared pieces)"
                )
            if self._resume is not None:
                self._train_sampler.load_state_dict(self._resume)
                self._resume = None
        return self._train_sampler

    @cached_property
    def sampling_headroom(self) -> tuple[float, float]:
        """How much longer sampled segmentations are than the prepared ones, per side
        ([`headroom`][attnx.data.sampling.headroom]); (1, 1) without subword sampling."""
        if not self.subword_sampling.enabled:
            return 1.0, 1.0
        self.subword_sampling.check(self.tokenizer)  # a setting the model cannot sample with: one line
        dataset = self._corpus.dataset(self.train_split)
        return headroom(dataset, self.tokenizer.to_bytes(), self.subword_sampling, self.seed)

    @property
    def pins_memory(self) -> bool:
        """Whether the loaders pin batches: `pin_memory` as given, or chosen from the device when None."""
        if self.pin_memory is not None:
            return self.pin_memory
        if self.trainer is not None:
            return self.trainer.strategy.root_device.type == "cuda"
        return torch.cuda.is_available()

    def _loader(
        self, split: str, sampler: TokenBatchSampler, dataset: BatchDataset | None = None
    ) -> DataLoader:
        return DataLoader(
            dataset or BatchDataset(self._corpus.dataset(split), sampler.buckets),
            sampler=sampler,
            batch_size=None,
            collate_fn=no_collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pins_memory,
            worker_init_fn=leave_stop_signals_to_the_parent if self.num_workers > 0 else None,
        )

    def _eval_loader(self, split: str) -> DataLoader:
        dataset = self._corpus.dataset(split)
        sampler = TokenBatchSampler(
            dataset.src_lengths,
            dataset.tgt_lengths,
            self.eval_max_tokens,
            shuffle=False,
            allow_oversized=True,
        )
        return self._loader(split, sampler)

    def train_dataloader(self) -> DataLoader:
        sampler = self.train_sampler
        if not self.subword_sampling.enabled:
            return self._loader(self.train_split, sampler)
        dataset = SampledBatches(
            self._corpus.dataset(self.train_split),
            self.tokenizer.to_bytes(),
            self.subword_sampling,
            self.seed,
            self.max_tokens,
            sampler.buckets,
            self.sampling_headroom,
            self.model_positions(),
        )
        return self._loader(self.train_split, sampler, dataset)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.valid_split)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_split)

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_split)

    def _consumed(self) -> int | None:
        """Training batches finished in this epoch, from the trainer when fitting (workers may run ahead)."""
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            # Private Lightning API, kept for want of a public one: Lightning 2.6 counts the training batches
            # finished in this epoch only in the fit loop's progress tracker, what it restores its own loop
            # state from (classes `_TrainingEpochLoop`, `_BatchProgress`). The loader's workers run ahead of
            # the loop; a datamodule gets no batch-end hook (its transfer hooks run before the step, so a batch
            # interrupted mid-step would count); the Trainer's public counters are optimizer steps and
            # epochs. tests/data/test_datamodule.py::test_the_private_batch_count_read_from_lightning_is_still_there
            # fails when an upgrade moves it or changes what it counts.
            return trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return None

    def state_dict(self) -> dict[str, Any]:
        """The training sampler's epoch and the batches consumed in it (Lightning stores this in checkpoints)."""
        if self._train_sampler is None:
            return dict(self._resume or {})
        return self._train_sampler.state_dict(self._consumed())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the training batch order where
        [`state_dict`][attnx.data.datamodule.TranslationDataModule.state_dict] left it."""
        if not state:
            return
        if self._train_sampler is None:
            self._resume = dict(state)
        else:
            self._train_sampler.load_state_dict(state)


def leave_stop_signals_to_the_parent(worker_id: int) -> None:
    """A DataLoader worker's start: SIGTERM and SIGUSR1 sent to the whole process group (Slurm's `scancel` and
    preemption, `timeout`, a service manager) would kill the workers, and the training process would fail with
    "DataLoader worker is killed by signal" instead of saving a checkpoint and saying how to resume. The training
    process stops on them; its workers end when it shuts them down, or when it is gone (PyTorch's workers
    already ignore Ctrl+C's SIGINT).

    A SIGTERM from the training process itself still ends the worker: at the interpreter's exit,
    `multiprocessing` terminates the daemonic workers it has left with SIGTERM and waits for them, and a worker
    ignoring it kept the stopped run from ever exiting. SIGTERM is blocked and a thread of the worker waits for
    it, ending the worker when the sender is its parent ([end_when_the_parent_asks][attnx.data.datamodule.end_when_the_parent_asks]).
    """
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the training process's handler, which a fork inherits
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before the thread: it inherits the mask
    parent = os.getppid()
    threading.Thread(target=end_when_the_parent_asks, args=(parent,), name="sigterm", daemon=True).start()


def end_when_the_parent_asks(parent: int) -> None:
    """Wait for SIGTERM (blocked in every thread of the worker); end the worker as SIGTERM's default does when
    `parent` sent it, and let it pass otherwise (a signal to the whole process group)."""
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    # delivered to this thread once it unblocks it: SIGTERM's default action ends the process
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os._exit(128 + signal.SIGTERM)  # not reached
