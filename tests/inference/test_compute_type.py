"""The CTranslate2 compute type `auto` decodes an export in: the fastest of those supported, by a probe."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnx.checkpoint import CheckpointError
from attnx.inference.compute_type import (
    AUTO,
    ComputeTypeChoice,
    auto_compute_type,
    compute_type_probe,
    fastest,
    probe_batch,
    resolve_compute_type,
    time_compute_types,
)


def test_the_fastest_type_wins_and_the_others_are_named_as_multiples_of_its_speed() -> None:
    choice = fastest({"float32": 1.0, "int8": 1.25, "int8_float32": 1.3})
    assert choice == ComputeTypeChoice(
        "float32", "the fastest here by a probe (int8 0.80x, int8_float32 0.77x its speed)"
    )
    assert fastest({"float32": 1.0, "int8": 1.0}).compute_type == "float32"  # a tie keeps float32
    assert fastest({"float32": 2.0}).reason == "the only compute type CTranslate2 supports on this device"


def test_auto_is_timed_once_per_export_device_and_threads(ct2_export: Path, capsys) -> None:
    timed: list[tuple[int, str]] = []

    def timer(directory, device, threads, types):
        timed.extend((threads, t) for t in types)
        return {t: {"float32": 1.0, "int8": 0.8}[t] for t in types}

    with compute_type_probe(timer):
        for _ in range(2):
            assert auto_compute_type(ct2_export, "cpu", 1, ["float32", "int8"]).compute_type == "int8"
        auto_compute_type(ct2_export, "cpu", 2, ["float32", "int8"])
    assert timed == [(1, "float32"), (1, "int8"), (2, "float32"), (2, "int8")]
    assert (
        capsys.readouterr().err.splitlines()
        == [
            "decoding in CTranslate2 int8: the fastest here by a probe (float32 0.80x its speed) "
            "(--precision 32-true to decode in float32)"
        ]
        * 2
    )


def test_a_damaged_export_is_refused_before_it_is_timed(ct2_export: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(ct2_export, broken)
    with open(broken / "model.bin", "r+b") as f:
        f.seek(100)
        f.write(b"\0\1\2\3")
    with (
        compute_type_probe(lambda *args: pytest.fail("timed")),
        pytest.raises(CheckpointError, match="model.bin"),
    ):
        auto_compute_type(broken, "cpu", 1, ["float32"])


def test_a_precision_given_takes_its_type_and_auto_is_left_to_the_engine() -> None:
    assert resolve_compute_type("32-true", "cpu") == "float32"
    assert resolve_compute_type("bf16-mixed", "cpu") == "bfloat16"
    assert resolve_compute_type("auto", "cpu") == resolve_compute_type(None, "cpu") == AUTO


def test_the_probe_times_each_type_on_the_model_itself(ct2_export: Path) -> None:
    """How long it takes depends on the machine; that it runs the export in each type and answers, does not."""
    assert probe_batch(1000) == probe_batch(1000) and all(
        4 <= i < 1000 for row in probe_batch(1000) for i in row
    )
    seconds = time_compute_types(ct2_export, torch.device("cpu"), 1, ["float32", "int8"])
    assert list(seconds) == ["float32", "int8"]
    assert all(math.isfinite(s) and s > 0 for s in seconds.values())


def test_the_timings_are_kept_so_three_commands_decode_in_one_type(ct2_export: Path, monkeypatch) -> None:
    """The probe's timings wander (int8 fastest, then float32, then int8_float32); the first is kept, so every
    later command (each a new process) decodes the export in the same type without timing it again."""
    from attnx.inference.compute_type import measured_by

    readings = iter(
        [
            {"float32": 1.0, "int8": 0.8, "int8_float32": 0.9},
            {"float32": 0.7, "int8": 0.8, "int8_float32": 0.9},
            {"float32": 1.0, "int8": 0.8, "int8_float32": 0.6},
        ]
    )
    calls = []

    def timer(directory, device, threads, types):
        calls.append(types)
        return next(readings)

    measure = measured_by(timer, keep=True)
    chosen = []
    for _ in range(3):
        monkeypatch.setenv("ATTNX_INHERITED_CHOICES", "{}")
        chosen.append(measure(ct2_export, torch.device("cpu"), 1, ["float32", "int8", "int8_float32"]))
    assert [c.compute_type for c in chosen] == ["int8"] * 3 and len(calls) == 1
    assert "kept in" in chosen[1].reason and chosen[1] == chosen[2]


def test_timings_beside_busy_processes_take_the_exports_own_type(ct2_export: Path, monkeypatch) -> None:
    import attnx.choices as choices
    from attnx.inference.compute_type import measured_by

    monkeypatch.setattr(choices, "busy_cores", lambda measure: (measure(), 0.9))
    measure = measured_by(lambda *args: {"float32": 1.0, "int8": 0.5}, keep=True)
    choice = measure(ct2_export, torch.device("cpu"), 1, ["float32", "int8"])
    assert choice.compute_type == "float32" and "0.9 cores busy" in choice.reason  # exported unquantized
