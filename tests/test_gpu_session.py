"""bench/gpu_session.sh and its preflight (bench/gpu_preflight.py): on a CPU, the session's smoke run prints
its row order and appends each row to the results as it is measured; the preflight names every piece the GPU
machine will lack and the paths to carry."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import gpu_preflight  # noqa: E402

SCRIPT = str(REPO / "bench" / "gpu_session.sh")


def tree(tmp_path: Path) -> Path:
    """A git work tree that ignores what the project's .gitignore ignores."""
    root = tmp_path / "tree"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shutil.copy(REPO / ".gitignore", root / ".gitignore")
    return root


def test_the_gpu_session_script_never_writes_over_earlier_results(tmp_path: Path) -> None:
    """bench/gpu_session.sh refuses a results folder with files in it, or an existing pack, before doing anything."""
    script = SCRIPT
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    earlier = tmp_path / "results"
    earlier.mkdir()
    (earlier / "session.log").write_text("an earlier run's log\n")
    pack = tmp_path / "fresh.tar"
    pack.write_text("an earlier pack\n")
    for folder, env in ((earlier, {}), (tmp_path / "fresh", {"ATTNX_GPU_TAR": str(pack)})):
        done = subprocess.run(
            ["bash", script, str(folder), "30"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert done.returncode == 2 and "already exists" in done.stderr, done.stderr
    assert (earlier / "session.log").read_text() == "an earlier run's log\n"
    assert pack.read_text() == "an earlier pack\n" and not (tmp_path / "fresh").exists()


def test_the_preflight_names_every_missing_piece_and_what_to_carry(tmp_path: Path, capsys) -> None:
    root = tree(tmp_path)
    assert gpu_preflight.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    for name in gpu_preflight.WHEELS:
        assert f"missing: wheel: {name} for Python 3.12 in .gpu/wheels/" in out
    assert "--python-version 3.12" in out and "jsonargparse==" in out and "sacremoses==" in out
    assert "missing: data: data/news is not a prepared corpus" in out
    assert "fix:   python bench/gpu_data.py --out data/news" in out
    assert "missing: data: data/raw/multi30k/ lacks train.en.gz" in out
    assert 'carry: ["data/news", "data/raw/multi30k"]' in out
    assert out.strip().endswith("not ready: 7 pieces missing (the device has no network)")


def test_the_preflight_says_ready_once_everything_is_there_and_refuses_wheels_of_another_python(
    tmp_path: Path, capsys
) -> None:
    root = tree(tmp_path)
    wheels = root / ".gpu" / "wheels"
    wheels.mkdir(parents=True)
    for name in (
        "jsonargparse-4.53.0",
        "docstring_parser-0.18.0",
        "typeshed_client-2.15.0",
        "py3langid-0.4.0",
    ):
        (wheels / f"{name}-py3-none-any.whl").write_bytes(b"")
    (wheels / "sacremoses-0.2.0-cp311-cp311-manylinux2014_x86_64.whl").write_bytes(b"")  # not for 3.12
    (root / "data" / "news").mkdir(parents=True)
    splits = {"train": {}, "valid": {}, "newstest2014": {}}
    (root / "data" / "news" / "meta.json").write_text(json.dumps({"splits": splits}))
    (root / "data" / "raw" / "multi30k").mkdir(parents=True)
    for name in gpu_preflight.MULTI30K_FILES:
        (root / "data" / "raw" / "multi30k" / name).write_bytes(b"")
    assert gpu_preflight.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert out.count("missing:") == 1 and "missing: wheel: sacremoses for Python 3.12" in out
    (wheels / "sacremoses-0.2.0-py3-none-any.whl").write_bytes(b"")
    done = subprocess.run(["bash", SCRIPT, "--check", "--root", str(root)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'carry: ["data/news", "data/raw/multi30k"]' in done.stdout and "ready: run" in done.stdout


@pytest.mark.slow
def test_the_smoke_run_prints_its_row_order_and_appends_each_row_as_it_is_measured(
    corpus: Path, tmp_path: Path
) -> None:
    """The decisive steps at toy sizes on a CPU: eager against captured rows, the peers, attnx fit with
    validation; the results file grows after each row, and the pack holds it after each step."""
    results = tmp_path / "results"
    env = {**os.environ, "ATTNX_GPU_SMOKE": "1", "ATTNX_GPU_DATA": str(corpus), "PYTHON": sys.executable}
    env |= {"ATTNX_GPU_STEPS": "capture peers fit", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", SCRIPT, str(results), "480"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (results / "session.log").read_text()
    order = [line.split()[1] for line in log.splitlines() if line.startswith("== ") and "(limit" in line]
    assert order == ["capture", "peers", "fit"], log
    assert "== rows, in order: capture (base, big; plain and captured at 256 and 512 tokens)" in log
    rows = [json.loads(line) for line in (results / "rows.jsonl").read_text().splitlines()]
    tables = [r["table"] for r in rows if r["table"] != "padding"]
    training = [(r["max_tokens"], r["variant"]) for r in rows if r["table"] == "training"]
    assert training == [
        (256, "plain"),
        (256, "captured (CUDA graphs)"),
        (512, "plain"),
        (512, "captured (CUDA graphs)"),
    ]
    assert all(
        r["error"] is None and r["tokens_per_s"] > 0 for r in rows if r["table"] in ("training", "peers")
    )
    peers = [(r["max_tokens"], r["round"], r["system"]) for r in rows if r["table"] == "peers"]
    assert len(peers) == 2 * 2 * 3 and {p[2] for p in peers} == {"attnx", "Marian", "nn.Transformer"}
    assert tables == ["training"] * 4 + ["peers"] * 12 + ["fit"]
    [fit] = [r for r in rows if r["table"] == "fit"]
    assert fit["steps"] == 4 and fit["validations"] == 2 and fit["tgt_tokens_per_s"] > 0
    counts = [int(n) for n in re.findall(r"exit \d+ after \d+s; (\d+) rows in ", log)]
    assert len(counts) == 3 and 0 < counts[0] < counts[1] == counts[2] == len(rows) - 1  # then the fit's row
    assert re.search(rf"== done after \d+s: {len(rows)} rows in ", log)
    assert (tmp_path / "results.tar").is_file()
