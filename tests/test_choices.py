"""Measurements `auto` takes are kept per machine kind: taken once, read back by later commands, not kept when
taken beside busy processes, inherited by the processes a command starts, and a damaged file is said and
measured past."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnx.choices as choices
from attnx.choices import (
    INHERITED,
    Remembered,
    busy_cores,
    choices_path,
    clear_choices,
    kept_choices,
    machine_key,
    remember,
)


class Measure:
    """A measurement that returns the next of `values` and counts its calls."""

    def __init__(self, *values) -> None:
        self.values, self.calls = list(values), 0

    def __call__(self):
        self.calls += 1
        return self.values.pop(0)


def test_a_measurement_is_taken_once_and_kept_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "choices.json"
    measure = Measure(1.4, 0.9)
    first, kept = remember("k", measure, "a ratio", path)
    assert (first, kept.how) == (1.4, "measured") and str(path) in kept.note()
    os.environ[INHERITED] = "{}"  # a later command: a new process
    again, kept = remember("k", measure, "a ratio", path)
    assert (again, kept.how, measure.calls) == (1.4, "kept", 1)
    assert "attnx choices --clear" in kept.note()
    entry = json.loads(path.read_text())["k"]
    assert entry["value"] == 1.4 and entry["what"] == "a ratio" and entry["measured"]


def test_a_probe_beside_busy_processes_is_not_trusted_and_not_kept(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "choices.json"
    monkeypatch.setattr(choices, "busy_cores", lambda measure: (measure(), 1.2))
    remembered = Remembered("k", Measure(0.7), "a ratio")
    monkeypatch.setenv("ATTNX_CHOICES", str(path))
    assert remembered() == 0.7 and remembered.busy
    assert "1.2 cores busy" in remembered.noted("why") and not path.exists()


def test_keeping_off_measures_every_time(monkeypatch) -> None:
    monkeypatch.setenv("ATTNX_CHOICES", "off")
    assert choices_path() is None
    measure = Measure(1.0, 2.0)
    assert remember("k", measure, "x")[1].how == "unkept"
    monkeypatch.setenv(INHERITED, "{}")
    assert remember("k", measure, "x")[0] == 2.0 and measure.calls == 2


def test_the_default_file_is_in_the_user_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ATTNX_CHOICES")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert choices_path() == tmp_path / "attnx" / "choices.json"


def test_a_damaged_file_is_said_measured_past_and_replaced(tmp_path: Path, capsys) -> None:
    path = tmp_path / "choices.json"
    path.write_text("{not json")
    value, kept = remember("k", Measure(3.0), "x", path)
    assert value == 3.0 and kept.how == "measured"
    assert f"kept choices in {path} cannot be read" in capsys.readouterr().err
    assert kept_choices(path)["k"]["value"] == 3.0


def test_clear_forgets_every_measurement(tmp_path: Path) -> None:
    path = tmp_path / "choices.json"
    remember("a", Measure(1.0), "x", path)
    os.environ[INHERITED] = "{}"
    remember("b", Measure(2.0), "y", path)
    assert clear_choices(path) == 2 and kept_choices(path) == {}
    assert clear_choices(tmp_path / "none.json") == 0


def test_processes_a_command_starts_take_its_measurement(tmp_path: Path) -> None:
    """A DDP rank or a server worker measures nothing: it reads what the command that started it took, even
    where that was not kept (busy, or keeping off)."""
    remember("k", Measure(1.7), "x", None)  # ATTNX_CHOICES of this test: kept; and passed on
    code = "from attnx.choices import remember; print(remember('k', lambda: 0.0, 'x')[0])"
    env = {**os.environ, "ATTNX_CHOICES": "off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.7"


def test_machine_keys_tell_kinds_shapes_and_threads_apart(monkeypatch) -> None:
    import torch

    key = machine_key("decoding", (256, 8000))
    assert key == machine_key("decoding", (256, 8000)) and len(key) == 20
    assert key != machine_key("decoding", (512, 8000)) and key != machine_key("training", (256, 8000))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert machine_key("decoding", (256, 8000)) != key
    finally:
        torch.set_num_threads(threads)


def test_busy_cores_counts_other_processes_not_this_one() -> None:
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat here")
    burn = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _, others = busy_cores(lambda: sum(i * i for i in range(3_000_000)))  # this process busy too
    finally:
        burn.kill()
        burn.wait()
    assert others >= 0.5  # the burner took about a core; this process's own time is not counted
