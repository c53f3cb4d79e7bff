"""bench/bench_gpu.py (the numbers of docs/gpu.md) at toy size: every table and record it promises, counted
from the real training batches of a prepared corpus."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnx.data.batching import TokenBatchSampler
from attnx.data.corpus import PreparedCorpus
from tests.conftest import REPO, bench_script

bench = bench_script("bench_gpu")
TOY = ["--model", "tiny", "--vocab_size", "300", "--max_tokens", "256", "--tokens_per_step", "512"]
TOY += ["--steps", "1", "--warmup", "1", "--test_split", "test", "--decode_sentences", "4"]


@pytest.mark.slow
def test_toy_run_reports_training_padding_and_decoding(corpus: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    out, rows = tmp_path / "results.json", tmp_path / "rows.jsonl"
    argv = ["--data", str(corpus), *TOY, "--precision", "fp32", "--json", str(out), "--rows", str(rows)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    appended = [json.loads(line) for line in rows.read_text().splitlines()]  # one a row, as measured
    assert [r.pop("table") for r in appended] == ["padding"] * 5 + ["training", "decoding"]
    assert appended == json.loads(json.dumps(results["padding"] + results["training"] + results["decoding"]))
    info = results["machine"]
    assert info["device"] in ("cpu", "cuda") and info["cpu"] and results["peak_flops"] > 0
    assert printed.count(f"CPU: {info['cpu']}") >= 3  # under every table

    dataset = PreparedCorpus(str(corpus)).dataset("train")
    padding = {row["max_tokens"]: row for row in results["padding"]}
    assert sorted(padding) == [256, 3125, 6250, 12500, 25000]
    for budget, row in padding.items():
        assert (
            row["batches"] == TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, budget).num_batches
        )
        assert 0 <= row["padding"] < 1 and 0 < row["budget_used"] <= 1

    [train] = results["training"]
    assert train["error"] is None and (train["accumulate"], train["steps"], train["precision"]) == (
        2,
        1,
        "fp32",
    )
    timed = bench.training_batches(corpus, 256, 4, pin=False)[2:]  # one warm-up step of two batches first
    assert train["tokens"] == sum(b.n_src_tokens + b.n_tgt_tokens for b in timed)
    assert train["target_tokens"] == sum(b.n_tgt_tokens for b in timed)
    assert train["flops"] == pytest.approx(
        sum(bench.batch_flops(bench.model_configs("tiny", 300)["tiny"], b) for b in timed)
    )
    assert train["tokens_per_s"] > train["target_tokens_per_s"] > 0 and train["mfu"] > 0
    assert len(train["losses"]) == 2 and train["machine"] == info

    [decoded] = results["decoding"]
    assert decoded["sentences"] == 4 and decoded["search"]["beam"] == 4 and decoded["mean_output_tokens"] >= 1


def test_vocabulary_below_the_corpus_is_refused(corpus: Path) -> None:  # noqa: F811
    with pytest.raises(SystemExit, match="--vocab_size 100 is below the corpus's vocabulary \\(300\\)"):
        bench.main(["--data", str(corpus), "--vocab_size", "100"])


def test_missing_corpus_names_the_prepare_option(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a prepared corpus: run with --prepare"):
        bench.main(["--data", str(tmp_path / "none")])


@pytest.mark.parametrize(("precision", "casts_weights"), [("fp32", False), ("bf16-mixed", True)])
def test_the_profile_tells_weight_copies_from_activation_copies(
    corpus: Path,  # noqa: F811
    precision: str,
    casts_weights: bool,
) -> None:
    """The profile's question the GPU left open: are a step's copies autocast's casts of the weights, or of
    activations? In fp32 nothing is cast; in bf16-mixed every linear layer's weight is."""
    config = bench.model_configs("tiny", 300)["tiny"]
    batches = bench.training_batches(corpus, 256, 6, pin=False)
    report = bench.profile_steps(config, batches, precision, 2, bench.torch.device("cpu"))
    [weights] = [line for line in report.splitlines() if "weights-shaped" in line]
    copies = int(weights.split(":")[1].split()[0].replace(",", ""))
    assert "Copies in one optimizer step (2 batches" in report
    assert (copies > 0) == casts_weights


def test_the_captured_loop_trains_as_the_plain_one(corpus: Path) -> None:  # noqa: F811
    """`--capture graphs` on a CPU (the engine replaying by calling the step again): the same losses as the
    plain loop, every shape captured before the timed steps."""
    import torch

    config = bench.model_configs("tiny", 300)["tiny"]
    batches = bench.training_batches(corpus, 256, 4, pin=False)
    runs = {}
    for variant in ("plain", "graphs"):
        result = bench.TrainResult("tiny", "fp32", 256, 2, variant)
        if variant == "plain":
            runs[variant] = bench.train_plain(config, batches, result, torch.device("cpu"), 1)
        else:
            runs[variant] = bench.train_captured(config, batches, result, torch.device("cpu"), 1, "graphs")
    assert runs["graphs"].timed.losses == pytest.approx(runs["plain"].timed.losses, rel=1e-5)
    assert runs["graphs"].capture_seconds > 0 and runs["plain"].capture_seconds is None
    assert runs["graphs"].timed.tokens == runs["plain"].timed.tokens > 0


@pytest.mark.slow
def test_peers_train_on_the_same_batches_in_alternating_rounds(corpus: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    """--peers: attnx, Hugging Face's MarianMTModel and torch.nn.Transformer, each fed the same batches of
    attnx's loader, with the same model dimensions, rounds in alternating order, every rate counted from
    the batches themselves and printed under the device line."""
    out = tmp_path / "peers.json"
    argv = ["--data", str(corpus), *TOY, "--precision", "fp32", "--decode_sentences", "0", "--peers"]
    assert bench.main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    peers = results["peers"]
    assert [(p["round"], p["system"]) for p in peers] == [
        (1, "attnx"),
        (1, "Marian"),
        (1, "nn.Transformer"),
        (2, "nn.Transformer"),
        (2, "Marian"),
        (2, "attnx"),
    ]
    timed = bench.training_batches(corpus, 256, 4, pin=False)[2:]
    config = bench.model_configs("tiny", 300)["tiny"]
    for peer in peers:
        assert peer["error"] is None and peer["steps"] == 1 and peer["machine"] == results["machine"]
        assert peer["target_tokens"] == sum(b.n_tgt_tokens for b in timed)
        assert peer["tokens"] == sum(b.n_src_tokens + b.n_tgt_tokens for b in timed)
        assert peer["flops"] == pytest.approx(sum(bench.batch_flops(config, b) for b in timed))
        assert peer["tokens_per_s"] > peer["target_tokens_per_s"] > 0 and peer["mfu"] > 0
        assert all(math.isfinite(loss) and loss > 0 for loss in peer["losses"])
    sizes = {p["system"]: p["parameters"] for p in peers}  # one model, three implementations
    embeddings, positions = 300 * 64, 1024 * 64  # Marian counts its fixed sinusoids as parameters
    assert sizes["Marian"] - 2 * positions == sizes["attnx"]  # encoder and decoder tables
    assert sizes["nn.Transformer"] - 2 * 2 * 64 == sizes["attnx"]  # its two final LayerNorms
    assert embeddings < sizes["attnx"]
    assert "÷ attnx" in printed and printed.count("# bench_gpu") == 1
    table = printed.split("## attnx and its peers")[1]
    assert f"device: {results['machine']['device_name']}" in table


def test_every_row_autocasts_without_the_cast_cache_and_the_captured_one_runs_in_bf16(corpus: Path) -> None:  # noqa: F811
    """The captured row under a cached autocast would replay the warm-up's casts of the weights (the engine
    refuses it); every row autocasts as Lightning's mixed precision does, so they compare alike."""
    import torch
    from gpu_timing import autocast

    with autocast(torch.device("cpu"), "bf16-mixed"):
        assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_cache_enabled()
    config = bench.model_configs("tiny", 300)["tiny"]
    batches = bench.training_batches(corpus, 256, 4, pin=False)
    result = bench.TrainResult("tiny", "bf16-mixed", 256, 2, "captured (CUDA graphs)")
    bench.train_captured(config, batches, result, torch.device("cpu"), 1, "graphs")
    assert result.error is None and len(result.timed.losses) == 2


def test_the_lightning_row_waits_for_the_device_only_where_timing_starts_and_ends(
    corpus: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the loop does: two synchronizations in all (a wait after every batch would bias fit against the
    loop), and the timed batches' tokens those of the loop's timed steps."""
    import gpu_lightning
    import torch

    calls = []
    monkeypatch.setattr(gpu_lightning, "sync", lambda device: calls.append(device))
    config = bench.model_configs("tiny", 300)["tiny"]
    result = bench.TrainResult("tiny", "fp32", 256, 2, "lightning")
    gpu_lightning.train_lightning(config, corpus, result, torch.device("cpu"), 1, 2)
    assert len(calls) == 2 and result.timed.steps == 2 and result.timed.seconds > 0
    plain = bench.TrainResult("tiny", "fp32", 256, 2, "plain")
    bench.train_plain(
        config, bench.training_batches(corpus, 256, 6, pin=False), plain, torch.device("cpu"), 1
    )
    assert (result.timed.tokens, result.timed.target_tokens) == (
        plain.timed.tokens,
        plain.timed.target_tokens,
    )
    assert result.timed.flops == pytest.approx(plain.timed.flops)


def test_no_module_of_bench_is_over_400_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (REPO / "bench").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}
