"""The ``attnx`` command as a user meets it: every expected failure is one line on stderr, exit 2 for usage
and config errors, 1 for runtime failures, never a traceback; help is quick and complete."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.cli import COMMANDS, main
from tests.training.conftest import fit_args


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_bare_fit_says_to_pass_a_config(capsys) -> None:
    assert main(["fit"]) == 2
    assert "--config" in one_line(capsys)


def test_missing_config_file_lists_the_packaged_ones(capsys) -> None:
    assert main(["fit", "--config", "nope.yaml"]) == 2
    line = one_line(capsys)
    assert "'nope.yaml'" in line and "multi30k_cpu" in line and "base" in line


def test_wrong_type_names_the_key(corpus: Path, capsys) -> None:
    assert main(fit_args(corpus, "--trainer.max_steps", "abc")) == 2
    line = one_line(capsys)
    assert "trainer.max_steps" in line and "abc" in line


def test_misspelt_option_suggests_the_close_one(corpus: Path, capsys) -> None:
    assert main(fit_args(corpus, "--model.warmup_stpes", "3")) == 2
    assert "did you mean --model.warmup_steps?" in one_line(capsys)
    assert (
        main(
            [
                "prepare",
                "--src_lang",
                "en",
                "--tgt_lang",
                "de",
                "--train",
                "x",
                "--output",
                "y",
                "--vocab_sise",
                "9",
            ]
        )
        == 2
    )
    assert "did you mean --vocab_size?" in one_line(capsys)
    assert main(["tranzlate"]) == 2
    assert "did you mean `attnx translate`?" in one_line(capsys)


def test_fit_before_prepare_says_to_prepare(corpus: Path, tmp_path: Path, capsys) -> None:
    assert main(fit_args(tmp_path / "nowhere")) == 1
    assert "attnx prepare --output" in one_line(capsys)


def test_impossible_model_is_a_usage_error(corpus: Path, capsys) -> None:
    assert main(fit_args(corpus, "--model.transformer.n_heads", "5")) == 2
    assert "must be a positive multiple of n_heads (5)" in one_line(capsys)


def test_test_without_weights_refuses(corpus: Path, capsys) -> None:
    assert main(fit_args(corpus, subcommand="test")) == 2
    assert "--ckpt_path" in one_line(capsys)


def test_full_disk_during_a_checkpoint_save_is_one_line(
    corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("attnx.files.os.fsync", full)
    assert main(fit_args(corpus, "--trainer.max_steps", "2")) == 1
    line = one_line(capsys)
    assert "the disk is full" in line and "step=1.ckpt" in line and "previous file is kept" in line
    assert not list(tmp_path.rglob("*.tmp"))


def unreadable_checkpoint_commands(corpus: Path, bad: Path, out: Path) -> dict[str, list[str]]:
    """Every command that reads a checkpoint, given ``bad`` as the checkpoint."""
    (out / "in.txt").write_text("A dog runs.\n")
    return {
        "fit": fit_args(corpus, "--ckpt_path", str(bad)),
        "validate": fit_args(corpus, "--ckpt_path", str(bad), subcommand="validate"),
        "test": fit_args(corpus, "--ckpt_path", str(bad), subcommand="test"),
        "translate": ["translate", "--model", str(bad), "--input", str(out / "in.txt")],
        "attention": ["attention", "--model", str(bad), "--text", "A dog.", "--output", str(out / "a.png")],
        "average": ["average", "--checkpoints", f"[{bad}, {bad}]", "--output", str(out / "avg.ckpt")],
        "export": [
            "export",
            "--ckpt_path",
            str(bad),
            "--format",
            "ctranslate2",
            "--output",
            str(out / "ct2"),
        ],
        "serve": ["serve", "--model", str(bad), "--port", "8977"],  # the model loads before the port is bound
    }


# every kind of file meets two commands or more (one process per command and kind; read_checkpoint's own test
# gives each command's one loader every kind)
UNREADABLE = {
    "fit": ("truncated", "payload"),
    "validate": ("random",),
    "test": ("pickle",),
    "translate": ("text", "empty zip"),
    "attention": ("payload",),
    "average": ("truncated",),
    "export": ("text",),
    "serve": ("random", "pickle"),
}


@pytest.mark.parametrize("command", UNREADABLE)
def test_an_unreadable_checkpoint_is_one_line_in_every_command(
    command: str, corpus: Path, tmp_path: Path
) -> None:
    from tests.checkpoint.test_format import unreadable_files

    files = unreadable_files(tmp_path / "bad")
    for kind in UNREADABLE[command]:
        args = unreadable_checkpoint_commands(corpus, files[kind], tmp_path)[command]
        done = subprocess.run(
            [sys.executable, "-m", "attnx", *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, (
            kind,
            done.stderr[-2000:],
        )
        assert lines[0].startswith(f"attnx {command}: error: ") and str(files[kind]) in lines[0], (
            kind,
            lines,
        )
        assert "weights_only" not in lines[0]
    assert not (tmp_path / "bad" / "ran").exists()  # the payload never ran


def test_debug_shows_the_traceback(corpus: Path, capsys) -> None:
    with pytest.raises(ValueError, match="n_heads"):
        main([*fit_args(corpus, "--model.transformer.n_heads", "5"), "--debug"])


def test_fit_in_a_log_file_prints_plain_lines(corpus: Path, tmp_path: Path) -> None:
    """No terminal (nohup, Slurm): no progress bar, one line per validation and at the end."""
    argv = [
        sys.executable,
        "-m",
        "attnx",
        *fit_args(corpus, "--trainer.max_steps", "8", "--progress.every_n_steps", "4"),
    ]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("step 4/8 | train loss") for line in lines) == 1
    assert sum(line.startswith("step 8/8 | val loss") and " bleu " in line for line in lines) == 1
    assert lines[-1].startswith("training ended at step 8")
    assert "\r" not in done.stdout + done.stderr  # no progress bar redrawn into the log
    for noise in ("Seed set to", "LightningCLI's args", "💡", "TPU available"):
        assert noise not in done.stdout + done.stderr


@pytest.mark.parametrize("name", ["prepare", "download", "plugins", "configs", "score"])
def test_help_of_commands_without_torch_imports_no_torch(name: str) -> None:
    code = (
        "import sys, contextlib, io\nfrom attnx.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main([{name!r}, '--help'])\n"
        "    except SystemExit:\n        pass\nprint('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True
    )
    assert done.stdout.strip() == "False", f"attnx {name} --help imported torch"


def test_every_command_is_documented_with_every_option() -> None:
    from attnx.cli import command_function

    for name in COMMANDS:
        if name in ("fit", "validate", "test", "predict"):
            continue
        function = command_function(name)
        doc = function.__doc__ or ""
        for parameter in __import__("inspect").signature(function).parameters:
            assert f"{parameter}:" in doc, f"attnx {name}: option --{parameter} has no help text"


def test_configs_lists_the_packaged_configs(capsys) -> None:
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    for name in ("base", "big", "multi30k_cpu", "tiny", "table3/E_learned_positions"):
        assert any(line.split()[0] == name for line in out.splitlines()), name


def test_misspelt_field_of_an_optional_settings_group_suggests_the_field(capsys) -> None:
    assert main(["translate", "--model", "x.ckpt", "--search.bem", "2"]) == 2
    assert "did you mean --search.beam?" in one_line(capsys)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--search.beam", "2", "--search.nbest", "3"], "search.nbest (3) cannot exceed search.beam (2)"),
        (["--search.sampling", "true", "--search.top_p", "0"], "search.top_p must be in (0, 1], got 0.0"),
        (
            ["--search.sampling", "true", "--search.temperature", "0"],
            "search.temperature must be from 0.001 to 1000, got 0",
        ),
        (["--search.top_k", "5"], "search.top_k=5 only shape sampling: add --search.sampling true"),
        (
            ["--search.alpha", "1e308"],
            "search.alpha must be from -5 to 5, got 1e+308",
        ),  # was an OverflowError
        (
            ["--search.sampling", "true", "--search.seed", str(2**80)],
            "search.seed must be from 0 to 2**64 - 1",
        ),
    ],
)
def test_a_refused_search_setting_is_its_own_one_line(options: list[str], message: str, capsys) -> None:
    """SearchConfig's check, not jsonargparse's account of every type it tried; exit 2 before any file is read."""
    assert main(["translate", "--model", "missing.ckpt", *options]) == 2
    line = one_line(capsys)
    assert line.startswith(f"attnx translate: error: {message}") and "Union" not in line


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["--help"], 141),
        (["plugins"], 141),
        (["describe", "--preset", "base"], 141),
        (["fit", "--print_config", "--config", "tiny"], 141),
        (["fit", "--help"], 0),  # argparse itself ignores a closed pipe while printing help
    ],
)
def test_output_cut_by_a_closed_pipe_exits_quietly(argv: list[str], status: int) -> None:
    """`attnx ... | head`: no traceback; 141 (128 + SIGPIPE) as a shell reports for `ls` or `git log`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attnx", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader goes away before the first line
    err = process.stderr.read()
    assert process.wait(timeout=600) == status and err == "", err


def test_a_missing_config_file_is_worded_alike_by_every_command(tmp_path: Path) -> None:
    lines = {}
    for name in ("fit", "translate", "prepare", "describe"):
        done = subprocess.run(
            [sys.executable, "-m", "attnx", name, "--config", "missing.yaml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        lines[name] = done.stderr.strip()
    for name, line in lines.items():
        assert line.startswith(f"attnx {name}: error: config 'missing.yaml' not found: no such file"), line
    assert "multi30k_cpu" in lines["fit"] and lines["translate"].endswith("no such file; check the path")


CONFIG_TYPOS = {
    "fit": ("trainr:\n  max_steps: 3\n", "unknown key trainr (did you mean trainer?)"),
    "validate": (
        "model:\n  transformer:\n    d_modle: 64\n",
        "unknown key model.transformer.d_modle (did you mean model.transformer.d_model?)",
    ),
    "translate": ("search:\n  bem: 3\n", "unknown key search.bem (did you mean search.beam?)"),
    "prepare": ("vocab_sise: 8000\n", "unknown key vocab_sise (did you mean vocab_size?)"),
    "average": ("lats: 3\n", "unknown key lats (did you mean last?)"),
    "describe": (
        "model:\n  transformer:\n    d_modle: 64\n",
        "unknown key model.transformer.d_modle (did you mean model.transformer.d_model?)",
    ),
}


@pytest.mark.parametrize("name", CONFIG_TYPOS)
def test_a_misspelt_key_in_a_config_file_names_the_file_the_key_and_the_meant_one(
    name: str, tmp_path: Path
) -> None:
    text, message = CONFIG_TYPOS[name]
    (tmp_path / "my.yaml").write_text(text)
    first = ["--config", "tiny"] if name in ("fit", "validate", "describe") else []
    done = subprocess.run(
        [sys.executable, "-m", "attnx", name, *first, "--config", "my.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr == f"attnx {name}: error: my.yaml: {message}\n", done.stderr


SIGINT_AFTER_THE_STOP = """
import os, signal, sys
import attnx.cli as cli
cli.run_command = lambda argv: 130  # a command stopped by its first Ctrl+C, which it has said
status = cli.main()
os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl+C, while the interpreter exits
sys.exit(status)
"""


def test_a_second_ctrl_c_after_the_stop_leaves_the_exit_status_as_it_is() -> None:
    """`attnx fit` saved, said where to resume and returns 130: a Ctrl+C that lands as the process exits (two in
    quick succession) ends it with 130, not by SIGINT with a KeyboardInterrupt."""
    done = subprocess.run([sys.executable, "-c", SIGINT_AFTER_THE_STOP], capture_output=True, text=True)
    assert done.returncode == 130 and "KeyboardInterrupt" not in done.stderr, done.stderr
