"""Weighted training corpora: Multi30k's training text cut into two named corpora of different sizes, drawn in
the asked mix, each batch from one corpus, epochs a function of (seed, epoch), resumable and split across DDP
ranks, every draw of an upsampled batch segmented anew under subword sampling; bad weights are one line; folders
prepared before the corpora's rows were recorded still load."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnx.cli import main as attnx
from attnx.data.batching import TokenBatchSampler
from attnx.data.datamodule import TranslationDataModule
from attnx.data.mixing import MixedBatchSampler, MixedEpochBatchSampler, training_corpora
from attnx.data.sampling import SubwordSampling
from attnx.errors import ConfigError
from tests.conftest import free_port
from tests.data.test_datamodule import DDP_SCRIPT

SIZES = {"big": 3000, "small": 1000}  # Multi30k's first 3,000 training pairs, then the next 1,000


def prepare_two_corpora(
    shared_data: Path, root: Path, sizes: dict[str, int] = SIZES, vocab: int = 500
) -> Path:
    """Multi30k's training pairs cut into named corpora of `sizes` pairs, in that order, prepared into one
    folder with `attnx prepare --train NAME=PREFIX ...` (the first 100 validation pairs as its valid split)."""
    start = 0
    for name, n in {**sizes, "val": 100}.items():
        split = "val" if name == "val" else "train"
        for lang in ("en", "de"):
            with gzip.open(shared_data / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = f.readlines()
            first = 0 if name == "val" else start
            (root / f"{name}.{lang}").write_text("".join(lines[first : first + n]), encoding="utf-8")
        start += 0 if name == "val" else n
    out = root / "prepared"
    argv = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--vocab_size", str(vocab), "--workers", "1"]
    argv += ["--drop_wrong_language", "false", "--valid", str(root / "val"), "--output", str(out)]
    for name in sizes:
        argv += ["--train", f"{name}={root / name}"]
    assert attnx(argv) == 0
    return out


@pytest.fixture(scope="module")
def two_corpora(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_two_corpora(shared_data, tmp_path_factory.mktemp("two_corpora"))


def mixed(data_dir: Path, weights=None, temperature=None, **kwargs) -> TranslationDataModule:
    kwargs = {"max_tokens": 1024, "shape_buckets": 8} | kwargs
    return TranslationDataModule(
        str(data_dir), corpus_weights=weights, sampling_temperature=temperature, **kwargs
    )


def realized(sampler: TokenBatchSampler, datamodule: TranslationDataModule, epoch: int) -> np.ndarray:
    """Each corpus's share of the pairs of `epoch`; every batch must come from one corpus."""
    mix = datamodule.corpus_mix
    pairs = np.zeros(len(mix.corpora))
    sampler.set_epoch(epoch)
    for indices in sampler:
        first, last = mix.corpus_of(int(indices[0])), mix.corpus_of(int(indices[-1]))
        assert first == last, "a batch mixes two corpora"
        pairs[first] += len(indices)
    return pairs / pairs.sum()


def test_the_prepared_folder_records_which_pairs_are_whose(two_corpora: Path) -> None:
    dm = mixed(two_corpora, {"big": 1, "small": 1})
    corpora = training_corpora(dm.corpus, "train")
    assert [c.name for c in corpora] == ["big", "small"]
    assert (
        corpora[0].start == 0
        and corpora[0].stop == corpora[1].start
        and corpora[1].stop == len(dm.corpus.dataset("train"))
    )
    kept = dm.corpus.meta["splits"]["train"]["corpora"]
    assert [c.pairs for c in corpora] == [kept["big"]["pairs"], kept["small"]["pairs"]]
    assert 2950 < corpora[0].pairs <= 3000 and 950 < corpora[1].pairs <= 1000  # a few dropped by cleaning
    # the last pair of "big" is Multi30k's training pair 3,000 or just before it, as its text says
    source = dm.tokenizer.sp.decode(dm.corpus.dataset("train")[corpora[0].stop - 1][0].tolist())
    assert source in (two_corpora.parent / "big.en").read_text(encoding="utf-8").splitlines()[-5:]


def shares(two_corpora: Path, weights: dict[str, float] | None, temperature: float | None) -> np.ndarray:
    """The shares asked, computed here from the corpora's sizes: p_i ∝ w_i (n_i / N)^(1/T)."""
    corpora = training_corpora(mixed(two_corpora, temperature=1).corpus, "train")
    w = np.array([(weights or {}).get(c.name, 1.0) for c in corpora], dtype=float)
    if temperature is not None:
        n = np.array([c.pairs for c in corpora], dtype=float)
        w = w * (n / n.sum()) ** (1 / temperature)
    return w / w.sum()


@pytest.mark.parametrize(
    ("weights", "temperature"),
    [
        ({"big": 1, "small": 1}, None),  # the small corpus up-sampled to half
        ({"big": 1, "small": 4}, None),
        ({"big": 5, "small": 1}, None),  # the big one up from its 75% to 83%
        (None, 1.0),  # natural proportions, every pair once
        (None, 5.0),  # flatter
        ({"big": 1, "small": 3}, 1.0),  # weights times sizes: the small corpus three times over
    ],
)
def test_realized_mix_is_the_asked_one(two_corpora: Path, weights, temperature) -> None:
    dm = mixed(two_corpora, weights, temperature)
    asked = shares(two_corpora, weights, temperature)
    assert np.allclose(dm.corpus_mix.shares, asked)
    sampler = dm.train_sampler
    assert isinstance(sampler, MixedBatchSampler)
    for epoch in range(3):
        assert np.abs(realized(sampler, dm, epoch) - asked).max() < 0.03, epoch
    assert np.abs(sampler.expected - asked).max() < 0.01  # after rounding to whole batches
    line = sampler.summary().splitlines()[1]
    assert line.startswith("corpus mix (") and f"asked big {asked[0]:.1%}, small {asked[1]:.1%}" in line


def test_an_epoch_is_one_pass_over_the_corpora_taking_part(two_corpora: Path) -> None:
    sampler = mixed(two_corpora, {"big": 1, "small": 1}).train_sampler
    big, small = sampler.planned
    assert len(sampler) == sampler.num_batches == big + small
    k_big, k_small = sampler.draws
    assert k_big < big and k_small > small  # big is drawn less than once an epoch, small more
    drawn: list[list[int]] = [[], []]  # each corpus's batches in the order they are drawn
    for epoch in range(4):
        batches = sampler.epoch_batches(epoch)
        drawn[0] += batches[batches < big].tolist()
        drawn[1] += (batches[batches >= big] - big).tolist()
    # each pass over a corpus holds each of its batches once, in a new order, across epoch boundaries
    for seen, n in zip(drawn, (big, small), strict=True):
        passes = [seen[p * n : (p + 1) * n] for p in range(len(seen) // n)]
        assert len(passes) >= 2 and all(sorted(p) == list(range(n)) for p in passes)
        assert passes[0] != passes[1]


def test_a_corpus_with_weight_0_is_left_out_and_said_so(two_corpora: Path) -> None:
    dm = mixed(two_corpora, {"big": 0, "small": 1})
    sampler = dm.train_sampler
    assert sampler.num_batches == sampler.planned[1]
    assert realized(sampler, dm, 0).tolist() == [0.0, 1.0]
    lines = sampler.summary().splitlines()
    assert lines[-1] == "corpus mix: big left out (weight 0): no batch of it is drawn"


def test_resumed_mid_epoch_the_sampler_draws_what_the_uninterrupted_one_drew(two_corpora: Path) -> None:
    whole = mixed(two_corpora, {"big": 1, "small": 2}).train_sampler
    expected = []
    for epoch in range(2):
        whole.set_epoch(epoch)
        expected += [b.tolist() for b in whole]
    first = mixed(two_corpora, {"big": 1, "small": 2}).train_sampler
    first.set_epoch(0)
    taken = [b.tolist() for _, b in zip(range(40), first, strict=False)]
    state = first.state_dict(consumed=40)
    assert state["corpus_draws"] == dict(zip(["big", "small"], map(int, first.draws), strict=True))
    rest = mixed(two_corpora, {"big": 1, "small": 2})
    rest.load_state_dict(state)
    sampler = rest.train_sampler
    sampler.set_epoch(0)
    taken += [b.tolist() for b in sampler]
    sampler.set_epoch(1)
    taken += [b.tolist() for b in sampler]
    assert taken == expected


def test_resumed_with_another_mix_warns_and_restarts_the_epoch(two_corpora: Path) -> None:
    first = mixed(two_corpora, {"big": 1, "small": 2}).train_sampler
    state = first.state_dict(consumed=5)
    other = mixed(two_corpora, {"big": 1, "small": 5}).train_sampler
    with pytest.warns(UserWarning, match="corpus draws"):
        other.load_state_dict(state)
    assert other._resume is None


def test_ddp_ranks_split_each_epoch_into_disjoint_equal_shares(two_corpora: Path) -> None:
    one = mixed(two_corpora, {"big": 1, "small": 3}).train_sampler
    ranks = [
        MixedBatchSampler(
            *(getattr(two_corpora_dataset(two_corpora), side) for side in ("src_lengths", "tgt_lengths")),
            1024,
            one.mix,
            seed=1,
            num_replicas=2,
            rank=rank,
            shape_buckets=8,
        )  # fmt: skip
        for rank in range(2)
    ]
    orders = [r.batch_order(3) for r in ranks]
    assert len(orders[0]) == len(orders[1]) == len(ranks[0])
    together = np.empty(len(orders[0]) * 2, dtype=np.int64)
    together[0::2], together[1::2] = orders
    epoch = one.epoch_batches(3)
    assert together[: len(epoch)].tolist() == epoch.tolist()  # every batch of the epoch, each on one rank


def two_corpora_dataset(two_corpora: Path):
    return mixed(two_corpora).corpus.dataset("train")


@pytest.mark.parametrize(
    ("weights", "temperature", "message"),
    [
        ({"big": -1, "small": 1}, None, "data.corpus_weights.big is -1: a weight is a number >= 0"),
        ({"big": float("nan"), "small": 1}, None, "data.corpus_weights.big is nan"),
        ({"big": 0, "small": 0}, None, "data.corpus_weights are all 0: give at least one"),
        ({"big": 1, "small": 1, "news": 2}, None, "names 'news', which is not a training corpus of"),
        ({"big": 1}, None, "data.corpus_weights has no weight for small: give one for each training corpus"),
        (None, 0.0, "data.sampling_temperature must be a number > 0"),
        (None, -2.0, "data.sampling_temperature must be a number > 0"),
        ({"big": 1, "small": 1}, float("inf"), "data.sampling_temperature must be a number > 0"),
    ],
)
def test_bad_weights_are_one_line_naming_the_option(two_corpora: Path, weights, temperature, message) -> None:
    with pytest.raises(ConfigError, match="^.*$") as err:
        mixed(two_corpora, weights, temperature)
    assert message in str(err.value) and "\n" not in str(err.value)
    if "news" in message:
        assert str(err.value).endswith("its corpora are big, small")


@pytest.mark.parametrize(
    ("weights", "temperature", "expected"),
    [
        ({"big": 1e308, "small": 1e308}, None, (0.5, 0.5)),  # their sum overflowed: every share NaN
        ({"big": 1e308, "small": 1e307}, None, (10 / 11, 1 / 11)),
        (None, 1e-300, (1.0, 0.0)),  # (n_i / N)^(1/T) underflowed to 0 for both corpora
        ({"big": 1e308, "small": 1e308}, 1e-300, (1.0, 0.0)),
        ({"big": 0, "small": 1}, 5e-324, (0.0, 1.0)),  # the smallest temperature: the one corpus taking part
        ({"big": 1, "small": 1e300}, 1e-3, (1.0, 0.0)),  # a weight cannot outweigh so low a temperature
    ],
)
def test_extreme_weights_and_temperatures_mix_as_their_limit_and_train(
    two_corpora: Path, weights, temperature, expected
) -> None:
    """Weights near the largest float and temperatures near 0 once gave NaN shares: no batch, and `attnx fit`
    ended "at step 0" with exit status 0 and no checkpoint. They mix as the formula's limit says."""
    dm = mixed(two_corpora, weights, temperature)
    assert np.allclose(dm.corpus_mix.shares, expected, rtol=1e-12, atol=1e-12)
    sampler = dm.train_sampler
    taking = [i for i, share in enumerate(expected) if share > 0]
    assert len(sampler) > 0 and all(sampler.draws[i] > 0 for i in taking)


@pytest.mark.parametrize(("weights", "temperature"), [({"train": 1}, None), (None, 2.0)])
def test_a_mix_of_a_single_corpus_folder_is_refused(corpus: Path, weights, temperature) -> None:
    option = "data.corpus_weights" if weights else "data.sampling_temperature"
    with pytest.raises(
        ConfigError, match=rf"^{option} is given, but .* holds one training corpus .*leave out"
    ):
        mixed(corpus, weights, temperature)


def test_the_fit_command_says_a_bad_weight_in_one_line(
    two_corpora: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    argv = ["fit", "--config", str(config), "--data.data_dir", str(two_corpora)]
    assert attnx([*argv, "--data.corpus_weights", "{big: 1, smal: 2}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "data.corpus_weights names 'smal'" in err and "its corpora are big, small" in err


def without_rows(folder: Path, copy: Path) -> Path:
    """`folder` as attnx prepared it before it recorded the rows of each training corpus."""
    shutil.copytree(folder, copy)
    meta = json.loads((copy / "meta.json").read_text())
    for entry in meta["splits"]["train"].get("corpora", {}).values():
        del entry["rows"]
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


def test_folders_prepared_before_rows_were_recorded_load_as_before(
    two_corpora: Path, corpus: Path, tmp_path: Path
) -> None:
    old = without_rows(two_corpora, tmp_path / "old_two")
    assert training_corpora(mixed(old).corpus, "train") == training_corpora(
        mixed(two_corpora).corpus, "train"
    )
    now, then = (mixed(d, {"big": 1, "small": 2}).train_sampler for d in (two_corpora, old))
    assert now.epoch_batches(1).tolist() == then.epoch_batches(1).tolist()

    single = without_rows(corpus, tmp_path / "old_single")
    plain = mixed(single, max_tokens=1536)
    assert plain.corpus_mix is None and type(plain.train_sampler) is TokenBatchSampler  # no mix: as before
    reference = mixed(corpus, max_tokens=1536).train_sampler
    assert [b.tolist() for b in plain.train_sampler] == [b.tolist() for b in reference]


def test_a_mix_keeps_subword_sampling(two_corpora: Path) -> None:
    dm = mixed(two_corpora, {"big": 1, "small": 1}, subword_sampling=SubwordSampling(alpha=0.1))
    sampler = dm.train_sampler
    assert (
        isinstance(sampler, MixedEpochBatchSampler)
        and "subword sampling: BPE-dropout 0.1" in sampler.summary()
    )
    epoch, indices, repeat = next(iter(sampler))
    batch = dm.train_dataloader().dataset[(epoch, indices, repeat)]
    assert batch.index.tolist() == indices.tolist()
    assert "corpus mix (data.corpus_weights {big: 1, small: 1})" in sampler.summary()


def sampled_epoch(
    dm: TranslationDataModule, epoch: int
) -> list[tuple[tuple[int, ...], torch.Tensor, torch.Tensor]]:
    """The training batches of `epoch` as the loader gives them: pairs, source and target."""
    dm.train_sampler.set_epoch(epoch)
    return [(tuple(b.index.tolist()), b.src, b.tgt_out) for b in dm.train_dataloader()]


def test_every_draw_of_an_upsampled_batch_is_segmented_anew_and_a_resume_draws_alike(
    two_corpora: Path,
) -> None:
    """`small` drawn 4 times as often as `big` comes several times an epoch: each draw of one of its batches is
    another segmentation (BPE-dropout is what an upsampled corpus needs most), the same for the same seed, and a
    run resumed mid-epoch draws what the uninterrupted run drew."""

    def datamodule() -> TranslationDataModule:
        return mixed(two_corpora, {"big": 1, "small": 4}, subword_sampling=SubwordSampling(alpha=0.1))

    dm = datamodule()
    whole = sampled_epoch(dm, 0)
    draws: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for pairs, src, tgt in whole:
        draws.setdefault(pairs, []).append(torch.cat([src.flatten(), tgt.flatten()]))
    repeated = [d for d in draws.values() if len(d) > 1]
    assert len(repeated) >= 10 and max(map(len, repeated)) >= 3  # the small corpus, passed over several times
    for segmented in repeated:
        assert len({tuple(x.tolist()) for x in segmented}) == len(segmented)  # no two draws alike
    again = sampled_epoch(datamodule(), 0)  # same seed: the same batches
    assert [p for p, *_ in again] == [p for p, *_ in whole]
    assert all(a.equal(b) and c.equal(d) for (_, a, c), (_, b, d) in zip(again, whole, strict=True))
    taken = len(whole) // 2
    rest = datamodule()
    rest.load_state_dict(dm.train_sampler.state_dict(consumed=taken))
    resumed = sampled_epoch(rest, 0)
    assert [p for p, *_ in resumed] == [p for p, *_ in whole[taken:]]
    assert all(a.equal(b) and c.equal(d) for (_, a, c), (_, b, d) in zip(resumed, whole[taken:], strict=True))


@pytest.mark.slow
def test_real_ddp_ranks_split_each_weighted_epoch(two_corpora: Path, tmp_path: Path) -> None:
    """Two CPU processes under Lightning's DDP: Lightning keeps the mixed sampler, and rank r trains on every
    second batch of the epoch's draws from r on, as the single-process sampler lays the epoch out."""
    script = tmp_path / "ddp.py"
    script.write_text(
        DDP_SCRIPT.replace(
            "TranslationDataModule(sys.argv[1], max_tokens=8192)",
            "TranslationDataModule(sys.argv[1], max_tokens=2048, corpus_weights={'big': 1, 'small': 1})",
        )
    )
    result = subprocess.run(
        [sys.executable, str(script), str(two_corpora), str(tmp_path)],
        env={**os.environ, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["sampler"] == "MixedBatchSampler" and r["replicas"] == 2 for r in ranks)
    one = mixed(two_corpora, {"big": 1, "small": 1}, max_tokens=2048, shape_buckets=0).train_sampler
    epoch = np.resize(one.epoch_batches(0), 2 * len(ranks[0]["seen"]))
    for rank, recorded in enumerate(ranks):
        expected = [one.order[one.bounds[k] : one.bounds[k + 1]].tolist() for k in epoch[rank::2]]
        assert recorded["seen"] == expected
