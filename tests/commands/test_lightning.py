"""`attnx fit | test | predict` end to end on a slice of Multi30k, and the CLI's clear errors."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from attnx.checkpoint import load_model
from attnx.cli import main as attnx
from attnx.commands.devices import check_devices
from attnx.training.estimate import CPU_MFU
from tests.training.conftest import _one_thread, fit_args, read_metrics  # noqa: F401 (one thread a module)


@pytest.fixture(scope="module")
def run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 8-step tiny fit (validation at steps 4 and 8, a checkpoint every step, the last 3 averaged)."""
    work = tmp_path_factory.mktemp("fit")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert attnx(fit_args(corpus)) == 0
    return work / "runs" / "tiny" / "version_0"


def test_fit_logs_every_metric_to_csv_and_tensorboard(run: Path) -> None:
    rows = read_metrics(run)
    columns = set(rows[0])
    for name in ("loss", "nll", "ppl", "lr", "tokens_per_s", "tgt_tokens_per_s", "mfu"):
        assert f"train/{name}" in columns
    for name in ("loss", "nll", "ppl", "bleu"):
        assert f"val/{name}" in columns
    train = [r for r in rows if r["train/loss"]]
    assert len(train) == 8
    assert all(math.isfinite(float(r["train/loss"])) for r in train)
    assert float(train[-1]["train/loss"]) < float(train[0]["train/loss"])
    nll = float(train[3]["train/nll"])
    assert float(train[3]["train/ppl"]) == pytest.approx(math.exp(nll), rel=1e-4)  # perplexity of the NLL
    assert 0 < float(train[-1]["train/mfu"]) < 1 and float(train[-1]["train/tokens_per_s"]) > 0
    assert list(run.glob("events.out.tfevents.*"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["transformer"]["d_model"] == 32 and saved["data"]["max_tokens"] == 512


def test_checkpoints_are_plain_and_averaged(run: Path) -> None:
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.ckpt")) == [
        "averaged.ckpt",
        "last.ckpt",
        "step=6.ckpt",
        "step=7.ckpt",
        "step=8.ckpt",
    ]
    for path in checkpoints.glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)  # no pickled classes anywhere
        assert checkpoint["attnx"]["transformer"]["vocab_size"] == 300  # linked from the data
    assert not list(checkpoints.glob(".*.tmp"))  # atomic writes leave no temporary files
    states = [torch.load(checkpoints / f"step={s}.ckpt", weights_only=True)["state_dict"] for s in (6, 7, 8)]
    averaged = load_model(checkpoints / "averaged.ckpt")
    name = "decoder_layers.1.ffn.w2.weight"
    expected = sum(s[f"model.{name}"] for s in states) / 3
    torch.testing.assert_close(averaged.model.state_dict()[name], expected)


def test_test_decodes_the_averaged_checkpoint_and_prints_scores(run: Path, corpus: Path, capsys) -> None:
    hyp = run.parent / "test.hyp"
    ckpt = run / "checkpoints" / "averaged.ckpt"
    extra = ["--ckpt_path", str(ckpt), "--evaluation.output_file", str(hyp), "--evaluation.search.beam", "3"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(run.parents[2])
        assert attnx(fit_args(corpus, *extra, subcommand="test")) == 0
    out = capsys.readouterr()
    assert "sacreBLEU BLEU = " in out.err + out.out and "nrefs:1|case:mixed" in out.err + out.out
    assert "paper-style tokenized BLEU" in out.err + out.out
    assert (out.err + out.out).count("test/bleu") == 0 and (out.out + out.err).count("sacreBLEU BLEU = ") == 1
    assert re.search(
        r"^test loss \d+\.\d{4} \(label-smoothed\), nll \d+\.\d{4}, perplexity \d", out.out, re.M
    )
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 50
    assert f"translations written to {hyp}" in out.out.splitlines()[-1]  # after the scores
    # the test of a checkpoint of a run logs into that run's folder, not a new version_N
    assert sorted(p.name for p in run.parent.iterdir() if p.is_dir()) == ["version_0"]
    test_run = run / "test" / "averaged"
    assert f"belongs to the run {run}; this test logs in {test_run}" in out.out
    assert yaml.safe_load((test_run / "config.yaml").read_text())["evaluation"]["search"]["beam"] == 3
    assert "test/bleu" in read_metrics(test_run)[0]
    # progress on a log file: one line at the end at least, in sentences
    assert "attnx test: 50/50 sentences (100.0%)" in out.err


def test_test_of_a_training_checkpoint_writes_beside_it_without_lightning_s_callback_warning(
    run: Path, corpus: Path, capsys, recwarn: pytest.WarningsRecorder
) -> None:
    """A training checkpoint holds CorpusMixLog's counts, and a test trainer without that callback had Lightning
    print "Please add the following callbacks: ['CorpusMixLog']"; its translations went to `test.test.hyp`."""
    ckpt = run / "checkpoints" / "last.ckpt"
    assert "CorpusMixLog" in torch.load(ckpt, weights_only=True)["callbacks"]
    extra = ["--ckpt_path", str(ckpt), "--evaluation.search.beam", "1"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(run.parents[2])
        assert attnx(fit_args(corpus, *extra, subcommand="test")) == 0
    out = capsys.readouterr()
    # Lightning's warning goes through `warnings`, which pytest records rather than prints
    said = [str(w.message) for w in recwarn] + [out.err, out.out]
    assert not [text for text in said if "Please add the following callbacks" in text], said
    hyp = run / "test" / "last" / "test.hyp"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 50
    assert out.out.splitlines()[-1] == f"translations written to {hyp}"  # in the folder of the path given


def test_test_s_last_count_is_printed_once(
    run: Path, corpus: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a log file a count is printed every minute and once at the end: where the last batch's minute line gave
    the final count, it came twice."""
    from attnx.inference import progress

    monkeypatch.setattr(
        progress, "LOG_EVERY", 0.0
    )  # a line for every batch: the last one gives the final count
    extra = ["--ckpt_path", str(run / "checkpoints" / "averaged.ckpt"), "--evaluation.search.beam", "1"]
    monkeypatch.chdir(run.parents[2])
    assert attnx(fit_args(corpus, *extra, "--data.eval_max_tokens", "200", subcommand="test")) == 0
    counts = [line for line in capsys.readouterr().err.splitlines() if line.startswith("attnx test: ")]
    assert len(counts) > 1 and counts[-1].startswith("attnx test: 50/50 sentences (100.0%)"), counts
    assert len([line for line in counts if "50/50" in line]) == 1, counts


def test_predict_writes_translations_in_corpus_order(run: Path, corpus: Path) -> None:
    out = run.parent / "predict.txt"
    extra = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--evaluation.output_file", str(out)]
    extra += ["--evaluation.search.beam", "1"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(run.parents[2])
        assert attnx(fit_args(corpus, *extra, subcommand="predict")) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    loaded = load_model(run / "checkpoints" / "last.ckpt")
    sources = (corpus / "test.en").read_text(encoding="utf-8").splitlines()
    from attnx.data.batch import collate
    from attnx.inference.config import SearchConfig
    from attnx.inference.search import translate_batch

    for i in (0, 17, 49):  # one sentence at a time, as the file must list them
        batch = collate([(loaded.tokenizer.encode(sources[i]), [])])
        ids = translate_batch(
            loaded.model, batch.src, batch.src_mask, SearchConfig(beam=1, max_len_b=20, max_positions=256)
        )[0]
        assert lines[i] == loaded.tokenizer.decode(ids)


def test_unknown_config_key_is_named(corpus: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  transformer:\n    d_modle: 64\n")
    assert attnx(fit_args(corpus, "--config", str(config))) == 2
    err = capsys.readouterr().err
    assert "d_modle" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_component_lists_known_names_without_traceback(corpus: Path, tmp_path: Path, capsys) -> None:
    rc = attnx(
        fit_args(corpus, "--model.transformer.feedforward.name", "swigluu", "--trainer.max_steps", "1")
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "unknown feedforward component 'swigluu'" in err and "relu" in err and "swiglu" in err
    assert "Traceback" not in err


def test_every_section_s_options_are_known_to_the_hints() -> None:
    """The ema and lora sections were left out: every bad value of theirs said "unknown option --ema.decay"."""
    from attnx.commands.lightning import option_names

    names = set(option_names())
    assert {"--ema.decay", "--ema.every", "--ema.start", "--ema.evaluate"} <= names
    assert {"--lora.rank", "--lora.alpha", "--lora.projections", "--lora.layers"} <= names


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--ema.decay", "nan"], ['Parser key "ema.decay"', "Given value: nan (nan is not a finite number"]),
        (["--ema.evaluate", "best"], ['Parser key "ema.evaluate"', "['ema', 'training']", "Got value: best"]),
        (["--lora.rank", "2.5"], ['Parser key "lora.rank"', "Expected a <class 'int'>", "Given value: 2.5"]),
        (["--lora.rank", "2", "--lora.alpha", ".nan"], ["lora.alpha must be a finite number > 0", "got nan"]),
        # values the model is built with (tests/model/test_builders.py has them all)
        (["--model.transformer.d_ff", "0"], ["d_ff must be an integer >= 1", "got 0"]),
        (
            [
                "--model.transformer.feedforward.name",
                "swiglu",
                "--model.transformer.feedforward.args",
                "{dropout: 1.5}",
            ],
            ["feedforward 'swiglu': dropout must be in [0, 1), got 1.5"],
        ),
    ],
)
def test_a_careless_value_is_one_line_that_names_it(corpus: Path, capsys, options, said) -> None:
    assert attnx(fit_args(corpus, "--trainer.max_steps", "1", *options)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "unknown option" not in err, err
    assert all(words in err for words in said), err


def test_missing_gpus_is_one_sentence_with_the_override(corpus: Path, capsys) -> None:
    rc = attnx(fit_args(corpus, "--trainer.accelerator", "gpu", "--trainer.devices", "8"))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert (
        "8 GPUs" in err
        and "--trainer.accelerator cpu --trainer.devices 1 --trainer.strategy auto --trainer.precision 32-true"
        in err
    )
    check_devices({"accelerator": "gpu", "devices": 2}, available=2)  # enough GPUs: no error


@pytest.mark.slow
def test_predict_takes_translate_s_search_options_and_refuses_an_nbest_list(
    run: Path, corpus: Path, capsys
) -> None:
    """`--evaluation.search.*` spells what `attnx translate --search.*` does: sampling with a seed gives the
    same translations twice; an n-best list, which one hypothesis file per sentence cannot hold, is one line."""
    ckpt = str(run / "checkpoints" / "last.ckpt")
    sampled = [
        "--evaluation.search.sampling",
        "true",
        "--evaluation.search.seed",
        "3",
        "--evaluation.search.top_k",
        "5",
    ]
    outputs = []
    for name in ("one.txt", "two.txt"):
        out = run.parent / name
        extra = ["--ckpt_path", ckpt, "--evaluation.output_file", str(out), *sampled]
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(run.parents[2])
            assert attnx(fit_args(corpus, *extra, subcommand="predict")) == 0
        outputs.append(out.read_text(encoding="utf-8").splitlines())
    assert outputs[0] == outputs[1] and len(outputs[0]) == 50
    capsys.readouterr()
    nbest = ["--ckpt_path", ckpt, "--evaluation.search.beam", "2", "--evaluation.search.nbest", "2"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(run.parents[2])
        assert attnx(fit_args(corpus, *nbest, subcommand="test")) == 2
    err = capsys.readouterr().err
    assert "evaluation.search.nbest must be 1" in err and len(err.strip().splitlines()) == 1, err


def test_checkpoint_of_another_program_is_a_clear_error(corpus: Path, tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    assert attnx(fit_args(corpus, "--ckpt_path", str(foreign), subcommand="test")) == 1
    assert "not an attnx checkpoint" in capsys.readouterr().err


def test_lightning_loads_the_checkpoints_back(run: Path) -> None:
    from attnx.training.module import TranslationTask

    for name in ("last.ckpt", "averaged.ckpt"):
        task = TranslationTask.load_from_checkpoint(
            run / "checkpoints" / name
        )  # torch.load(weights_only=True)
        decodable = load_model(run / "checkpoints" / name)
        assert task.config == decodable.config
        torch.testing.assert_close(task.model.state_dict(), decodable.model.state_dict())


def resume_copy(run: Path, tmp_path: Path) -> Path:
    """The fixture run's last checkpoint, copied away from its run folder (as `good.ckpt`)."""
    good = tmp_path / "good.ckpt"
    good.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes())
    return good


def test_options_changed_on_resume_are_applied_said_and_recorded(
    run: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from attnx.training.schedule import inverse_sqrt_schedule

    monkeypatch.chdir(tmp_path)
    changed = [
        "--model.lr_factor",
        "0.5",
        "--model.transformer.dropout",
        "0.3",
        "--model.label_smoothing",
        "0.0",
    ]
    args = [*changed, "--trainer.max_steps", "10", "--ckpt_path", str(resume_copy(run, tmp_path))]
    assert attnx(fit_args(corpus, *args)) == 0
    out = capsys.readouterr().out.splitlines()
    for line in (
        "resume: trainer.max_steps 8 -> 10",
        "resume: model.transformer.dropout 0.1 -> 0.3",
        "resume: model.label_smoothing 0.1 -> 0.0",
        "resume: model.lr_factor 1.0 -> 0.5",
    ):
        assert line in out, out
    ours = tmp_path / "runs" / "tiny" / "version_0"
    config = yaml.safe_load((ours / "config.yaml").read_text())["model"]
    assert (config["lr_factor"], config["label_smoothing"], config["transformer"]["dropout"]) == (
        0.5,
        0.0,
        0.3,
    )
    rows = {int(r["step"]): r for r in read_metrics(ours) if r["train/loss"]}
    assert sorted(rows) == [8, 9]
    # the next step trains with the new factor (over the optimizer state the checkpoint restored) ...
    assert float(rows[8]["train/lr"]) == pytest.approx(inverse_sqrt_schedule(9, 32, 4, 0.5), rel=1e-6)
    # ... without label smoothing (the loss is the NLL) and with the new dropout
    assert float(rows[8]["train/loss"]) == pytest.approx(float(rows[8]["train/nll"]), rel=1e-6)
    saved = torch.load(ours / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["attnx"]["transformer"]["dropout"] == 0.3 and saved["global_step"] == 10


@pytest.mark.parametrize(
    ("option", "value", "before"), [("model.transformer.d_model", "64", "32"), ("seed_everything", "2", "1")]
)
def test_a_change_a_resume_cannot_make_is_refused_in_one_line(
    run: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, option, value, before
) -> None:
    monkeypatch.chdir(tmp_path)
    good = resume_copy(run, tmp_path)
    args = [f"--{option}", value, "--trainer.max_steps", "10", "--ckpt_path", str(good)]
    assert attnx(fit_args(corpus, *args)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"attnx fit: error: --{option} {value} differs from {before} in {good}"), line
    assert not (tmp_path / "runs").exists()


def test_init_from_starts_a_new_run_from_the_weights(
    run: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from attnx.training.schedule import inverse_sqrt_schedule

    monkeypatch.chdir(tmp_path)
    good = resume_copy(run, tmp_path)
    assert attnx(fit_args(corpus, "--trainer.max_steps", "2", "--evaluation.bleu_samples", "0")) == 0
    assert (
        attnx(
            fit_args(
                corpus, "--trainer.max_steps", "2", "--evaluation.bleu_samples", "0", "--init_from", str(good)
            )
        )
        == 0
    )
    assert f"init_from: the weights of {good} (step 8); a new run" in capsys.readouterr().out
    fresh, tuned = (read_metrics(tmp_path / "runs" / "tiny" / f"version_{v}") for v in (0, 1))
    fresh, tuned = ([r for r in rows if r["train/loss"]] for rows in (fresh, tuned))
    assert [int(r["step"]) for r in tuned] == [0, 1]  # a fresh step count ...
    assert float(tuned[0]["train/lr"]) == pytest.approx(
        inverse_sqrt_schedule(1, 32, 4), rel=1e-6
    )  # ... and schedule
    assert tuned[0]["train/loss"] != fresh[0]["train/loss"]  # same batch, seed and masks: other weights
    assert (
        torch.load(tmp_path / "runs/tiny/version_1/checkpoints/last.ckpt", weights_only=True)["global_step"]
        == 2
    )


def test_init_from_is_refused_with_ckpt_path_or_another_architecture(
    run: Path, corpus: Path, tmp_path: Path, capsys
) -> None:
    good = str(run / "checkpoints" / "last.ckpt")
    assert attnx(fit_args(corpus, "--init_from", good, "--ckpt_path", good)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"attnx fit: error: --init_from {good} and --ckpt_path {good} both given"), line
    assert attnx(fit_args(corpus, "--init_from", good, "--model.transformer.d_ff", "128")) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"attnx fit: error: --init_from {good} holds another model than the config describes (d_ff: checkpoint "
        "64 vs config 128); set the config's model.transformer to the checkpoint's"
    )


def test_a_gpu_config_on_cpu_says_its_plan_first_and_prints_after_the_first_step(
    corpus: Path, tmp_path: Path
) -> None:
    """configs/big.yaml with the overrides its device check suggests (a small model here, so that a step takes
    a second): the estimate of a step and of the run, and of the sanity check, come before anything runs, and
    the first progress line after step 1 instead of after 100 steps."""
    import subprocess
    import sys

    small = [
        "--model.transformer.d_model",
        "32",
        "--model.transformer.d_ff",
        "64",
        "--model.transformer.n_heads",
        "4",
    ]
    small += ["--model.transformer.encoder_layers", "1", "--model.transformer.decoder_layers", "1"]
    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
    cpu += ["--trainer.precision", "32-true", "--trainer.accumulate_grad_batches", "8"]
    argv = ["fit", "--config", "big", "--data.data_dir", str(corpus), "--data.num_workers", "0", *cpu, *small]
    argv += ["--data.max_tokens", "512", "--data.eval_max_tokens", "512", "--trainer.max_steps", "2"]
    argv += ["--evaluation.bleu_samples", "0", "--torch_threads", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("estimated memory per device: ") and "activations" in lines[0], lines[:4]
    assert lines[1].startswith("estimated time: ") and f" a step at {CPU_MFU:.0%} MFU of " in lines[1]
    assert (
        "32-true peak of this CPU (1 thread): measured now" in lines[1]
        and "for 2 steps (max_steps)" in lines[1]
    )
    # 2 steps of 8 batches end before big.yaml's first validation at 5,000 batches: said, with the option
    assert lines[2].startswith("no validation in this run: it ends after about 16 batches, before its first")
    assert lines[3].startswith("first a sanity check: 2 validation batches of 512 tokens per side")
    assert lines[4].startswith("batches: ") and "shapes" in lines[4] and "Total FLOPs" not in done.stdout
    assert next(line for line in lines if line.startswith("step ")).startswith("step 1/2 | train loss")


def test_test_decodes_with_mbr_when_asked(run: Path, corpus: Path, capsys) -> None:
    hyp = run.parent / "test_mbr.hyp"
    ckpt = run / "checkpoints" / "averaged.ckpt"
    search = [
        "--evaluation.search.mbr",
        "4",
        "--evaluation.search.seed",
        "1",
        "--evaluation.search.max_len_b",
        "5",
    ]
    extra = ["--ckpt_path", str(ckpt), "--evaluation.output_file", str(hyp), *search]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(run.parents[2])
        assert attnx(fit_args(corpus, *extra, subcommand="test")) == 0
    out = capsys.readouterr()
    assert "sacreBLEU BLEU = " in out.err + out.out
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 50
    test_run = run / "test" / "averaged"
    assert yaml.safe_load((test_run / "config.yaml").read_text())["evaluation"]["search"]["mbr"] == 4


@pytest.mark.parametrize(
    ("subcommand", "when"), [("fit", "before training began"), ("test", "before test ended")]
)
def test_sigterm_lightning_reports_is_one_line_that_says_when(
    subcommand: str, when: str, monkeypatch, capsys
) -> None:
    """Lightning turns a SIGTERM that comes outside training (while `attnx test` decodes, say) into its own
    exception: one line saying when it came, exit 143, and no claim that training was under way."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    def sigterm(*args, **kwargs):
        raise SIGTERMException

    monkeypatch.setattr("attnx.commands.lightning.AttnxCLI", sigterm)
    assert attnx([subcommand, "--config", "tiny"]) == 143
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        line
        == f"attnx {subcommand}: interrupted by SIGTERM {when}; nothing was saved: run the same command again"
    )


def test_a_distributed_run_destroys_its_process_group_before_it_returns(
    corpus: Path, tmp_path: Path, monkeypatch
) -> None:
    """Lightning destroys NCCL groups alone: a gloo group left to the interpreter's exit aborted a rank now and
    then ("terminate called without an active exception"). attnx ends every rank's group when its command ends."""
    import torch.distributed as dist

    from tests.conftest import free_port

    monkeypatch.chdir(tmp_path)
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "1", "--trainer.max_steps", "1"]
    before = dict(
        os.environ
    )  # Lightning's DDP sets WORLD_SIZE, LOCAL_RANK, ...: not for the tests after this one
    os.environ["MASTER_PORT"] = str(free_port())
    try:
        assert attnx(fit_args(corpus, *ddp, "--evaluation.bleu_samples", "0")) == 0
        assert not dist.is_initialized()
    finally:
        os.environ.clear()
        os.environ.update(before)
