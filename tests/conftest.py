"""Shared fixtures: where the real corpora are, tiny model configs, a fresh plugin registry, torch on one thread."""

from __future__ import annotations

import gzip
import importlib.util
import os
import random
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from attnx.cli import main as attnx
from attnx.inference.compute_type import compute_type_probe
from attnx.inference.precision import PrecisionChoice, decoding_probe
from attnx.model import TransformerConfig

REPO = Path(__file__).resolve().parents[1]

# what `auto` measures is kept in a file of the test session's own, never in the user's (attnx.choices), and
# nothing is inherited from a command that started pytest
os.environ["ATTNX_CHOICES"] = str(Path(tempfile.mkdtemp(prefix="attnx-choices-")) / "choices.json")
os.environ.pop("ATTNX_INHERITED_CHOICES", None)


def bench_script(name: str) -> ModuleType:
    """bench/NAME.py as a module, imported as `python bench/NAME.py` runs it: with bench/ on the path (its
    `harness` and `attnx_steps`), and registered under its name (dataclasses look their module up there)."""
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pytest_plugins = ["tests.trained"]  # the small trained model, trained once per session for every folder

SUITE_COST = (
    'the whole suite takes about a quarter of an hour on a quiet 2-core machine; -m "not slow" is the quick '
    "subset (a few minutes, without the end-to-end runs)"
)
"""What a run of the tests costs, as the README's "Run the tests" says it (tests/test_suite_header.py)."""


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [SUITE_COST]


def cost_unsaid(config: pytest.Config) -> bool:
    """Whether the run is the whole suite under `-q`, which shows no header (on the controller only, not on
    each xdist worker): the cost is then said first, on a line of its own."""
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    return whole and config.get_verbosity() < 0 and not hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and cost_unsaid(session.config):
        reporter.write_line(SUITE_COST)


def shared_data_dir() -> Path:
    """Real corpora: ``$ATTNX_DATA_DIR`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("ATTNX_DATA_DIR", REPO.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "multi30k").is_dir():
        pytest.fail(f"real corpora not found at {path}: set ATTNX_DATA_DIR to the folder holding multi30k/")
    return path


def free_port() -> int:
    """A free TCP port below Linux's ephemeral range (32768 and up), for a test's distributed job to listen on.

    A port taken from that range (bind to port 0, then close) can meanwhile be handed to a connection of another
    test's job running beside it: the ranks of the two jobs then talk to each other, and gloo aborts ("terminate
    called without an active exception")."""
    for _ in range(1000):
        port = random.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port from 20000 to 32767")


@pytest.fixture(autouse=True)
def _choices_of_this_test(tmp_path_factory, monkeypatch) -> None:
    """What `auto` measures in a test is kept in a file of that test's own, and nothing is inherited."""
    monkeypatch.setenv("ATTNX_CHOICES", str(tmp_path_factory.mktemp("choices") / "choices.json"))
    monkeypatch.setenv("ATTNX_INHERITED_CHOICES", "{}")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


FP32_PROBE = PrecisionChoice("32-true", "the tests' probe")


@pytest.fixture(autouse=True)
def _decode_in_fp32() -> Iterator[None]:
    """Decoding's `auto` measures nothing in the test process: checkpoints decode in 32-true and exports in
    float32 whatever this CPU's bf16 or int8 units, so outputs compared between engines or with expectations do
    not depend on the machine, and it is not said (tests that count output lines predate the choice). A test of
    the choice injects its own probe inside, which says it; commands the tests start as processes probe the
    machine (give them --precision where their output is compared)."""
    float32_first = lambda directory, device, threads, types: {t: float(t != "float32") for t in types}  # noqa: E731
    with (
        decoding_probe(lambda device, decoder: FP32_PROBE, say=False),
        compute_type_probe(float32_first, say=False),
    ):
        yield


def one_thread() -> Iterator[None]:
    """Torch on one thread for the duration: tiny models gain nothing from threads, and on a busy 2-core machine
    threads wait on each other (a second thread makes them 2-3× slower).

    The folders whose tests decode or train use it on every test, each with one line of its conftest:
    `_one_thread = pytest.fixture(autouse=True)(one_thread)` (a scope of its own where it needs one), so a test
    that changes the threads leaves the next one on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _one_thread_in_this_process() -> Iterator[None]:
    """The models run in the test process are tiny: a second thread gains them nothing, and every operation then
    waits for it — 20x slower on a busy 2-core machine (the decoding page's examples: 19 s instead of 1.5 s).
    Commands the tests start as processes choose their own threads."""
    yield from one_thread()


def tiny_config(**overrides) -> TransformerConfig:
    """A 2+2-layer, d_model 32 model: fast enough for every unit test."""
    values = dict(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        d_ff=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_len=128,
    )
    return TransformerConfig(**(values | overrides))


@pytest.fixture
def tiny() -> TransformerConfig:
    return tiny_config()


SPLITS = {"train": 400, "val": 50, "test_2016_flickr": 50}


@pytest.fixture(scope="session")
def corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 400 training and 50 validation/test pairs of Multi30k en-de, 300-piece joint BPE."""
    root = tmp_path_factory.mktemp("multi30k_slice")
    for split, n in SPLITS.items():
        for lang in ("en", "de"):
            with gzip.open(shared_data / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (root / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    out = root / "prepared"
    argv = [
        "--src_lang",
        "en",
        "--tgt_lang",
        "de",
        "--vocab_size",
        "300",
        "--workers",
        "1",
        "--output",
        str(out),
    ]
    argv += [
        "--train",
        str(root / "train"),
        "--valid",
        str(root / "val"),
        "--test",
        str(root / "test_2016_flickr"),
    ]
    assert attnx(["prepare", *argv]) == 0
    return out
