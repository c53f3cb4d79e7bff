"""The CPU precision follows the CPU's bf16 units (decided by flags and a probe result, never by timing here),
is printed once by `attnx fit`, and an explicit --trainer.precision wins (bf16 on a CPU without bf16 units with
one warning line)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import attnx.training.precision as precision
from attnx.cli import main as attnx
from attnx.training.precision import (
    choose_cpu_precision,
    cpu_flags,
    cpu_has_bf16_units,
    emulated_bf16_line,
    resolve_cpu_precision,
)
from tests.training.conftest import fit_args

SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
ZEN2 = {"avx2", "fma", "f16c"}


def never_probed() -> float:
    raise AssertionError("the matmul probe runs only for AVX512-BF16 without AMX")


def test_amx_trains_in_bf16_without_probing() -> None:
    choice = choose_cpu_precision(SAPPHIRE_RAPIDS, never_probed)
    assert choice.line() == "precision: bf16-mixed (CPU has AMX)"


def test_no_bf16_units_trains_in_fp32_without_probing() -> None:
    assert choose_cpu_precision(ZEN2, never_probed).line() == "precision: 32-true (CPU has no bf16 units)"
    assert choose_cpu_precision({"amx_tile"}, never_probed).precision == "32-true"  # tiles without bf16


@pytest.mark.parametrize(("ratio", "expected"), [(2.1, "bf16-mixed"), (1.3, "bf16-mixed"), (1.1, "32-true")])
def test_avx512_bf16_alone_follows_the_probe(ratio: float, expected: str) -> None:
    choice = choose_cpu_precision(ZEN4, lambda: ratio)
    assert choice.precision == expected and f"measured {'only ' * (expected == '32-true')}{ratio:.1f}x" in (
        choice.reason
    )


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "avx512_bf16", "amx_tile"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_only_an_unset_precision_on_cpu_is_chosen(monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    unset = {"accelerator": "cpu", "precision": None}
    assert resolve_cpu_precision(unset).precision == "bf16-mixed" and unset["precision"] == "bf16-mixed"
    explicit = {"accelerator": "cpu", "precision": "32-true"}
    assert resolve_cpu_precision(explicit) is None and explicit["precision"] == "32-true"
    gpu = {"accelerator": "gpu", "precision": None}
    assert resolve_cpu_precision(gpu) is None and gpu["precision"] is None  # Lightning's default stands


def fit(corpus: Path, work: Path, *extra: str) -> tuple[list[str], dict]:
    """One-step tiny fit; its stdout lines and the trainer section of the config it saved."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.chdir(work)
        assert (
            attnx(fit_args(corpus, "--trainer.max_steps", "1", "--trainer.val_check_interval", "1", *extra))
            == 0
        )
    saved = yaml.safe_load((work / "runs" / "tiny" / "version_0" / "config.yaml").read_text())
    return out.getvalue().splitlines(), saved["trainer"]


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (SAPPHIRE_RAPIDS, "precision: bf16-mixed (CPU has AMX)"),
        (ZEN2, "precision: 32-true (CPU has no bf16 units)"),
    ],
)
def test_fit_prints_the_choice_once_and_trains_in_it(flags, line, corpus: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    lines, trainer = fit(corpus, tmp_path, "--trainer.precision", "null")
    assert [x for x in lines if x.startswith("precision:")] == [line]
    assert trainer["precision"] == line.split()[1]


def test_explicit_precision_wins(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    lines, trainer = fit(corpus, tmp_path, "--trainer.precision", "32-true")
    assert not [x for x in lines if x.startswith("precision:")] and trainer["precision"] == "32-true"


@pytest.mark.parametrize(
    ("asked", "units", "warned"),
    [("bf16-mixed", False, True), ("bf16-true", False, True), ("bf16-mixed", True, False)],
)
def test_explicit_bf16_on_a_cpu_without_bf16_units_is_warned_in_one_line(
    asked: str, units: bool, warned: bool, corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: units)
    lines, trainer = fit(corpus, tmp_path, "--trainer.precision", asked)
    assert trainer["precision"] == asked and not [x for x in lines if x.startswith("precision:")]
    said = [x for x in capsys.readouterr().err.splitlines() if "bf16 units" in x]
    expected = (
        f"attnx fit: warning: trainer.precision {asked} on a CPU without bf16 units (no AVX512-BF16 or AMX): "
        "bf16 is emulated there and trains many times slower than fp32: use --trainer.precision 32-true"
    )
    assert said == ([expected] if warned else [])


def test_only_bf16_on_a_cpu_is_warned_and_unknown_flags_are_not(monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: False)
    assert emulated_bf16_line({"accelerator": "cpu", "precision": "bf16"}) is not None
    assert emulated_bf16_line({"accelerator": "cpu", "precision": "32-true"}) is None
    assert emulated_bf16_line({"accelerator": "gpu", "precision": "bf16-mixed"}) is None
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: None)  # flags not readable: unknown
    assert emulated_bf16_line({"accelerator": "cpu", "precision": "bf16-mixed"}) is None
    for flags, units in [(ZEN2, False), (ZEN4, True), (SAPPHIRE_RAPIDS, True), (frozenset(), None)]:
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert cpu_has_bf16_units() is units


def test_attnx_fit_command_prints_the_precision_of_this_cpu(corpus: Path, tmp_path: Path) -> None:
    """The real command: one line, naming what this machine's flags (and probe) gave, and the run trains in it."""
    argv = fit_args(corpus, "--trainer.max_steps", "1", "--trainer.val_check_interval", "1")
    argv += ["--trainer.precision", "null"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *argv], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [x for x in done.stdout.splitlines() if x.startswith("precision:")]
    assert len(lines) == 1
    flags = cpu_flags()
    if flags >= precision.AMX_FLAGS:
        assert lines[0] == "precision: bf16-mixed (CPU has AMX)"
    elif precision.AVX512_BF16_FLAG in flags:
        assert "(CPU has AVX512-BF16" in lines[0]
    else:
        assert lines[0] == "precision: 32-true (CPU has no bf16 units)"
    saved = yaml.safe_load((tmp_path / "runs" / "tiny" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == lines[0].split()[1]


class Speedups:
    """A probe of a machine whose readings wander (a busy one): the next of `ratios` at each call."""

    def __init__(self, *ratios: float) -> None:
        self.ratios, self.calls = list(ratios), 0

    def __call__(self, *args, **kwargs) -> float:
        self.calls += 1
        return self.ratios.pop(0)


def weights(run: Path) -> dict:
    import torch

    checkpoint = run / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


def test_three_fits_on_one_machine_train_alike_beside_a_busy_process(
    corpus: Path, tmp_path: Path, monkeypatch
) -> None:
    """The probe's readings wander (1.4x, then 0.9x, then 1.5x); the first is kept, so every run trains in the
    same precision with the same shape buckets, batches and weights, the second one beside a process that keeps
    a core busy."""
    import torch

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(ZEN4))
    speedups = Speedups(1.4, 0.9, 1.5)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", speedups)
    runs = []
    for i in range(3):
        monkeypatch.setenv("ATTNX_INHERITED_CHOICES", "{}")  # each run a new command
        (work := tmp_path / f"run{i}").mkdir()
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if i == 1 else None
        try:
            lines, trainer = fit(corpus, work, "--trainer.precision", "null")
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()
        runs.append(([x for x in lines if x.startswith(("precision:", "batches:"))], trainer["precision"]))
    assert speedups.calls == 1
    assert runs[0][1] == runs[1][1] == runs[2][1] == "bf16-mixed"
    assert runs[0][0][1:] == runs[1][0][1:] == runs[2][0][1:] and "shape_buckets 8" in runs[0][0][1]
    assert "kept in" in runs[1][0][0] and "measured" in runs[1][0][0]
    first = weights(tmp_path / "run0")
    for i in (1, 2):
        assert all(torch.equal(first[k], v) for k, v in weights(tmp_path / f"run{i}").items())


def test_a_resumed_fit_trains_in_the_precision_its_run_recorded(corpus: Path, tmp_path: Path, monkeypatch):
    """A resume takes the precision the run started in from its folder, whatever the probe says now."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(ZEN4))
    monkeypatch.setattr(precision, "bf16_matmul_speedup", Speedups(1.6))
    fit(corpus, tmp_path, "--trainer.precision", "null")
    monkeypatch.setenv("ATTNX_CHOICES", "off")  # nothing kept: the probe would now say fp32
    monkeypatch.setattr(precision, "bf16_matmul_speedup", never_probed)
    run = tmp_path / "runs" / "tiny" / "version_0"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.chdir(tmp_path)
        resumed = fit_args(corpus, "--trainer.max_steps", "2", "--trainer.precision", "null")
        assert attnx([*resumed, "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]) == 0
    said = [x for x in out.getvalue().splitlines() if x.startswith("precision:")]
    recorded = "runs/tiny/version_0/config.yaml"
    assert said == [f"precision: bf16-mixed (the precision this run trained in, recorded in {recorded})"]


def test_a_probe_beside_busy_processes_trains_in_fp32_and_keeps_nothing(monkeypatch) -> None:
    import attnx.choices as choices

    monkeypatch.setattr(precision, "bf16_matmul_speedup", Speedups(2.0))
    monkeypatch.setattr(choices, "busy_cores", lambda measure: (measure(), 1.5))
    choice = precision.kept_cpu_precision(ZEN4)
    assert choice.precision == "32-true" and "1.5 cores busy" in choice.reason
    assert not Path(os.environ["ATTNX_CHOICES"]).exists()
