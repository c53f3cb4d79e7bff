"""The GPU pages say what to run and what it gives, and their commands parse.

docs/gpu.md and docs/benchmarks.md hold the current figures only: the rounds before them, before/after
comparisons and the commits they were taken at live on docs/history.md ("How we got here"). The one place
with the whole commands for base and big on 8 GPUs or one, with the WMT14 data, is the "Commands" section of
docs/wmt14.md; each of its commands, and each one-GPU form the configs' headers give, is parsed by the real
``attnx`` parser (``--print_config``, in this process: nothing is trained or downloaded).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest
import yaml

from attnx.cli import main as attnx
from tests.conftest import REPO

DOCS = REPO / "docs"
CURRENT = ["gpu.md", "benchmarks.md"]
# A commit as the pages quoted them (bf19d46, `fa5e029`): 7 to 40 hex digits with a letter and a digit.
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])")
NOTEBOOK = [
    "first round",
    "after the fix",
    "before the fix",
    "at commit",
    "this checkout",
    "the commit before",
]
TOKENS_A_STEP = 25_000  # per side, §5.1
VALIDATE_EVERY = 5_000  # optimizer steps, as configs/base.yaml and big.yaml validate on 8 GPUs


def section(page: str, title: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    assert f"\n## {title}\n" in text, f"docs/{page} has no section '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def commands(markdown: str) -> list[list[str]]:
    """The commands of the ```bash blocks, continuation lines joined, comments and blank lines left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(shlex.split(line, comments=True))
    return found


def printed(argv: list[str]) -> dict:
    """What ``attnx ... --print_config`` prints for `argv`, parsed; the command must parse (exit 0)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            status = attnx([*argv, "--print_config"])
        except SystemExit as stop:
            status = stop.code
    assert status in (0, None), f"`attnx {shlex.join(argv)}` does not parse"
    return yaml.safe_load(out.getvalue())


def batch_of(config: dict) -> tuple[int, int, int, str]:
    """Tokens per side an optimizer step, optimizer steps between validations, devices, strategy."""
    trainer, data = config["trainer"], config["data"]
    devices, accumulate = int(trainer["devices"]), trainer["accumulate_grad_batches"]
    tokens = data["max_tokens"] * devices * accumulate
    return tokens, trainer["val_check_interval"] // accumulate, devices, trainer["strategy"]


@pytest.mark.parametrize("page", CURRENT)
def test_the_current_figures_pages_are_not_a_lab_notebook(page):
    text = (DOCS / page).read_text(encoding="utf-8")
    commits = sorted(set(COMMIT.findall(text)))
    phrases = [p for p in NOTEBOOK if p in text.lower()]
    assert not commits and not phrases, (
        f"docs/{page} gives current figures only; move {commits + phrases} to docs/history.md (How we got here)"
    )


def test_the_history_is_one_page_of_the_site_that_both_pages_link_to():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    assert {"How we got here": "history.md"} in nav
    assert "commit" in (DOCS / "history.md").read_text(encoding="utf-8")
    for page in CURRENT:
        assert "](history.md" in (DOCS / page).read_text(encoding="utf-8"), f"docs/{page} does not link it"


def test_the_gpu_page_keeps_a_section_for_captured_steps():
    assert section("gpu.md", "Captured steps (CUDA graphs)").strip()


@pytest.fixture(scope="module")
def wmt14_commands() -> list[list[str]]:
    return commands(section("wmt14.md", "Commands"))


def options(argv: list[str]) -> dict[str, str]:
    """`--key value` pairs of a command line (every option of these commands takes one value)."""
    pairs = argv[argv.index("--config") :]
    assert len(pairs) % 2 == 0 and all(k.startswith("--") for k in pairs[::2]), shlex.join(argv)
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def test_the_data_commands_parse_and_feed_the_training_commands(wmt14_commands):
    assert [c[:2] for c in wmt14_commands[:2]] == [["attnx", "download"], ["attnx", "prepare"]]
    downloaded, prepared = (printed(argv[1:]) for argv in wmt14_commands[:2])
    assert all(
        path.startswith(downloaded["output"] + "/") for path in [*prepared["train"], prepared["valid"]]
    )
    for argv in wmt14_commands[2:]:
        assert argv[:2] in (["attnx", "fit"], ["attnx", "test"]), shlex.join(argv)
        config = yaml.safe_load((REPO / options(argv)["--config"]).read_text(encoding="utf-8"))
        assert config["data"]["data_dir"] == prepared["output"], shlex.join(argv)


def test_every_option_of_the_training_commands_exists(wmt14_commands):
    from attnx.commands.lightning import option_names

    known = set(option_names())
    for argv in wmt14_commands[2:]:
        unknown = set(options(argv)) - known
        assert not unknown, f"`{shlex.join(argv)}`: no such option {sorted(unknown)}"


def test_the_commands_train_base_and_big_on_8_gpus_and_on_one_as_the_paper(wmt14_commands):
    """The 8-GPU commands are the configs as written (tests/training/test_configs.py parses those); each
    one-GPU command is parsed here by the real parser, which costs a few seconds a command."""
    runs: dict[str, set[int]] = {}
    for argv in wmt14_commands:
        given = options(argv) if argv[1] in ("fit", "test") else {}
        if argv[1] == "test":
            ckpt = given["--ckpt_path"]
            name = given["--config"].removeprefix("configs/").removesuffix(".yaml")
            assert ckpt.startswith(f"runs/{name}/version_0/checkpoints/"), shlex.join(argv)
        if argv[1] != "fit":
            continue
        if set(given) == {"--config"}:
            devices = 8
        else:
            tokens, validate_every, devices, strategy = batch_of(printed(argv[1:]))
            assert (tokens, validate_every, devices, strategy) == (
                TOKENS_A_STEP,
                VALIDATE_EVERY,
                1,
                "auto",
            ), shlex.join(argv)
        runs.setdefault(given["--config"], set()).add(devices)
    assert runs == {"configs/base.yaml": {1, 8}, "configs/big.yaml": {1, 8}}


@pytest.mark.parametrize("name", ["base.yaml", "big.yaml"])
def test_each_one_gpu_form_of_a_configs_header_is_a_whole_command(name):
    """The header's one-GPU lines (an option list may go on over the next comment line) name the device and
    keep the paper's tokens a step: their options over the config's values."""
    from attnx.commands.lightning import option_names

    path = REPO / "configs" / name
    text = path.read_text(encoding="utf-8")
    header = [line.removeprefix("#").strip() for line in text.splitlines() if line.startswith("#")]
    forms = []
    for i, line in enumerate(header):
        if line.startswith("1 GPU"):
            rest = line.split(":", 1)[1]
            forms.append(shlex.split(rest if "--" in rest else header[i + 1]))
    assert len(forms) == 2, f"configs/{name}: the two one-GPU forms of its header"
    known = set(option_names())
    for form in forms:
        given = dict(zip(form[::2], form[1::2], strict=True))
        assert set(given) <= known, f"configs/{name}: no such option in {shlex.join(form)}"
        config = yaml.safe_load(text)
        for key, value in given.items():
            section_name, field = key.removeprefix("--").split(".")
            config[section_name][field] = yaml.safe_load(value)
        tokens, _, devices, strategy = batch_of(config)
        assert (tokens, devices, strategy) == (TOKENS_A_STEP, 1, "auto"), (
            f"configs/{name}: {shlex.join(form)}"
        )
