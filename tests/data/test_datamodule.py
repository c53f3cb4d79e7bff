from __future__ import annotations

import os
import pickle
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from attnx.data.batch import Batch
from attnx.data.datamodule import TranslationDataModule
from attnx.data.tokenizer import Tokenizer
from tests.conftest import free_port


def indices(loader) -> list[list[int]]:
    return [batch.index.tolist() for batch in loader]


def test_yields_batches_within_budget_covering_the_corpus(multi30k: Path) -> None:
    dm = TranslationDataModule(str(multi30k), max_tokens=2048)
    assert dm.vocab_size == 8000 and isinstance(dm.tokenizer, Tokenizer) and dm.corpus.src_lang == "en"
    seen = []
    for batch in dm.train_dataloader():
        assert isinstance(batch, Batch)
        assert batch.src.numel() <= 2048 and batch.tgt_out.numel() <= 2048
        seen += batch.index.tolist()
    assert sorted(seen) == list(range(len(dm.corpus.dataset("train"))))


def test_evaluation_loaders_cover_each_pair_once_in_a_fixed_order(multi30k: Path) -> None:
    dm = TranslationDataModule(str(multi30k), max_tokens=1024, eval_max_tokens=3000)
    for loader, n in [(dm.val_dataloader, 1014), (dm.test_dataloader, 1000), (dm.predict_dataloader, 1000)]:
        first, again = indices(loader()), indices(loader())
        assert first == again
        assert sorted(sum(first, [])) == list(range(n))
        assert max(len(b) for b in first) > 1024 // 20  # the evaluation budget applies


def test_resume_from_state_dict_continues_with_the_next_batch(multi30k: Path) -> None:
    dm = TranslationDataModule(str(multi30k), max_tokens=4096, seed=7)
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    full = indices(loader)
    loader.sampler.set_epoch(1)
    it = iter(loader)
    for _ in range(10):
        next(it)
    state = dm.state_dict()

    fresh = TranslationDataModule(str(multi30k), max_tokens=4096, seed=7)
    fresh.load_state_dict(state)
    resumed = fresh.train_dataloader()
    resumed.sampler.set_epoch(1)
    assert indices(resumed) == full[10:]


def test_workers_give_the_same_batches(multi30k: Path) -> None:
    plain = TranslationDataModule(str(multi30k), eval_max_tokens=8000)
    workers = TranslationDataModule(str(multi30k), eval_max_tokens=8000, num_workers=2)
    assert indices(workers.val_dataloader()) == indices(plain.val_dataloader())


def test_pickled_dataset_carries_paths_not_data(multi30k: Path) -> None:
    dataset = TranslationDataModule(str(multi30k)).corpus.dataset("train")
    blob = pickle.dumps(dataset)
    assert len(blob) < 2000
    copy = pickle.loads(blob)
    assert all(np.array_equal(a, b) for a, b in zip(copy[123], dataset[123], strict=True))


def test_pinning_follows_the_trainer_device_unless_set(multi30k: Path, tmp_path: Path) -> None:
    assert TranslationDataModule(str(multi30k)).pins_memory is torch.cuda.is_available()  # no trainer yet
    on_cpu = TranslationDataModule(str(multi30k))
    on_cpu.trainer = trainer(tmp_path, accelerator="cpu")
    assert on_cpu.pins_memory is False and on_cpu.train_dataloader().pin_memory is False
    forced = TranslationDataModule(str(multi30k), pin_memory=True)
    forced.trainer = trainer(tmp_path, accelerator="cpu")
    assert forced.pins_memory is True
    off = TranslationDataModule(str(multi30k), pin_memory=False)
    assert off.val_dataloader().pin_memory is False and off.train_dataloader().pin_memory is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_come_pinned_when_training_on_cuda(multi30k: Path, tmp_path: Path) -> None:
    dm = TranslationDataModule(str(multi30k), num_workers=1)
    dm.trainer = trainer(tmp_path, accelerator="gpu", devices=1)
    batch = next(iter(dm.train_dataloader()))
    assert dm.pins_memory and batch.src.is_pinned() and batch.tgt_mask.is_pinned()
    assert torch.equal(batch.to("cuda").src.cpu(), batch.src)


class Recorder(L.LightningModule):
    """Records the corpus indices of every training batch; the weights do not matter here."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, 4)
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch.index.tolist()))
        return self.embedding(batch.src).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    options = dict(
        max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0
    )
    return L.Trainer(default_root_dir=tmp_path, **(options | kwargs))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lightning_resume_mid_epoch_continues_with_the_next_batch(multi30k: Path, tmp_path: Path) -> None:
    """A checkpoint taken after batch 5 of epoch 1; the resumed run sees exactly the batches after it."""
    dm = TranslationDataModule(str(multi30k), max_tokens=8192, seed=3)
    n = len(dm.train_dataloader())
    straight = Recorder(dm.vocab_size)
    trainer(tmp_path / "a").fit(
        straight, datamodule=TranslationDataModule(str(multi30k), max_tokens=8192, seed=3)
    )
    assert [e for e, _ in straight.seen] == [0] * n + [1] * n
    assert straight.seen[:n] != straight.seen[n:]

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=n + 5, save_top_k=-1
    )
    first = Recorder(dm.vocab_size)
    trainer(tmp_path / "b", max_steps=n + 5, callbacks=[checkpoint]).fit(
        first, datamodule=TranslationDataModule(str(multi30k), max_tokens=8192, seed=3)
    )
    path = next((tmp_path / "ckpt").glob("*.ckpt"))
    assert torch.load(path, weights_only=False)["TranslationDataModule"]["consumed"] == 5

    second = Recorder(dm.vocab_size)
    trainer(tmp_path / "c").fit(
        second, datamodule=TranslationDataModule(str(multi30k), max_tokens=8192, seed=3), ckpt_path=path
    )
    assert first.seen + second.seen == straight.seen


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_private_batch_count_read_from_lightning_is_still_there(multi30k: Path, tmp_path: Path) -> None:
    """The datamodule reads Lightning's private fit-loop progress (`trainer.fit_loop.epoch_loop.batch_progress
    .current.processed`; Lightning 2.6 has no public count of the batches done in an epoch): it must still
    exist and count the batches whose step finished in this epoch, as the public `batch_idx` of the batch
    hooks does, or resuming mid-epoch would skip or repeat batches."""

    class Counts(L.Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[str, int, int, int]] = []

        def record(self, when: str, trainer: L.Trainer, batch_idx: int) -> None:
            private = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            consumed = trainer.datamodule.state_dict()["consumed"]
            self.seen.append((when, batch_idx, private, consumed))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.record("start", trainer, batch_idx)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.record("end", trainer, batch_idx)

    dm = TranslationDataModule(str(multi30k), max_tokens=8192, seed=3)
    counts = Counts()
    trainer(tmp_path, limit_train_batches=3, callbacks=[counts]).fit(Recorder(dm.vocab_size), datamodule=dm)
    expected = [
        (when, i, i + done, i + done)
        for _ in range(2)
        for i in range(3)
        for when, done in (("start", 0), ("end", 1))
    ]
    assert counts.seen == expected


class Echo(Recorder):
    def predict_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return batch.index


def test_lightning_predict_returns_every_test_pair_once(multi30k: Path, tmp_path: Path) -> None:
    dm = TranslationDataModule(str(multi30k), eval_max_tokens=2000)
    indices = torch.cat(trainer(tmp_path).predict(Echo(dm.vocab_size), datamodule=dm))
    assert sorted(indices.tolist()) == list(range(1000))


def test_state_before_training_round_trips(multi30k: Path) -> None:
    dm = TranslationDataModule(str(multi30k))
    assert dm.state_dict() == {}
    state = {
        "epoch": 3,
        "consumed": 2,
        "seed": 1,
        "num_batches": dm.train_sampler.num_batches,
        "num_replicas": 1,
    }
    fresh = TranslationDataModule(str(multi30k))
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state  # kept until the sampler exists
    assert fresh.train_sampler.epoch == 3 and len(list(fresh.train_sampler)) == len(fresh.train_sampler) - 2


DDP_SCRIPT = """
import json, sys
import lightning as L, torch
from attnx.data.datamodule import TranslationDataModule

class Recorder(L.LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, 4)
        self.seen = []
    def training_step(self, batch, batch_idx):
        self.seen.append(batch.index.tolist())
        return self.embedding(batch.src).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
    def on_train_end(self):
        sampler = self.trainer.train_dataloader.sampler
        with open(f"{sys.argv[2]}/rank{self.global_rank}.json", "w") as f:
            json.dump({"sampler": type(sampler).__name__, "replicas": sampler.num_replicas, "seen": self.seen}, f)

if __name__ == "__main__":
    dm = TranslationDataModule(sys.argv[1], max_tokens=8192)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0)
    trainer.fit(Recorder(dm.vocab_size), datamodule=dm)
"""


@pytest.mark.slow
def test_real_ddp_ranks_split_the_epoch(multi30k: Path, tmp_path: Path) -> None:
    """Two CPU processes under Lightning's DDP: Lightning keeps our sampler, the ranks split the corpus evenly."""
    import json
    import subprocess
    import sys

    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(multi30k), str(tmp_path)],
        env={**os.environ, "MASTER_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["sampler"] == "TokenBatchSampler" and r["replicas"] == 2 for r in ranks)
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) > 0
    first, second = ({i for batch in r["seen"] for i in batch} for r in ranks)
    n = len(TranslationDataModule(str(multi30k)).corpus.dataset("train"))
    assert first | second == set(range(n))
    padding = (
        2 * len(ranks[0]["seen"])
        - TranslationDataModule(str(multi30k), max_tokens=8192).train_sampler.num_batches
    )
    assert padding in (0, 1) and (padding or not first & second)


WORKER = """
import os, signal, sys, time
from attnx.data.datamodule import leave_stop_signals_to_the_parent
pid = os.fork()
if pid == 0:  # the worker: started as a DataLoader starts its workers
    leave_stop_signals_to_the_parent(0)
    print("ready", flush=True)
    time.sleep(600)
    os._exit(0)
print(pid, flush=True)
sys.stdin.readline()  # the test has signalled the worker from outside: now its parent does
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, flush=True)
"""


def test_a_worker_ignores_a_group_sigterm_but_ends_on_its_parent_s() -> None:
    """scancel's SIGTERM to the whole group leaves a DataLoader worker running (the training process saves); the
    SIGTERM with which its parent's `multiprocessing` ends leftover workers at exit ends it (it used to be
    ignored too, and a run stopped by SIGTERM never exited)."""
    import select
    import signal
    import subprocess
    import sys
    import time

    with subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        try:
            worker = int(parent.stdout.readline())
            assert parent.stdout.readline().strip() == "ready"
            os.kill(worker, signal.SIGTERM)  # from this process: neither the worker's parent nor the worker
            os.kill(worker, signal.SIGUSR1)
            time.sleep(1.0)  # time for either signal to end the worker, had it not been left to the parent
            state = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state != "Z", "a SIGTERM or SIGUSR1 from outside ended the worker"
            parent.stdin.write("\n")
            parent.stdin.flush()
            ready, _, _ = select.select([parent.stdout], [], [], 600)  # at once; waited out only on failure
            assert ready and parent.stdout.readline().strip() == str(int(signal.SIGTERM))
        finally:
            parent.kill()
