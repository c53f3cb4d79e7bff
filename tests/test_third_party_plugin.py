"""A third party's plugin: pip-installed from plugins/, found through its entry point, used by name.

The distribution is installed into a temporary target directory the way any package is installed, then
used from a fresh process that has that directory on its path: attnx itself is not changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PLUGIN = REPO / "plugins" / "restricted_attention"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(target), str(PLUGIN)],
        check=True,
        capture_output=True,
    )
    return os.environ | {"PYTHONPATH": os.pathsep.join([str(target), str(REPO)])}


def run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_plugins_command_lists_the_installed_distribution(installed):
    out = run(installed, "-m", "attnx", "plugins")
    line = next(line for line in out.splitlines() if line.strip().startswith("restricted"))
    assert "attnx_restricted.RestrictedSelfAttention" in line
    assert "[attnx-restricted-attention 0.1.0]" in line


def test_config_uses_the_plugin_by_name_and_trains(installed, tmp_path):
    config = tmp_path / "restricted.yaml"
    config.write_text(
        "transformer:\n"
        "  vocab_size: 40\n  d_model: 32\n  n_heads: 4\n  d_ff: 64\n"
        "  encoder_layers: 2\n  decoder_layers: 2\n  dropout: 0.0\n"
        "  self_attention: {name: restricted, args: {window: 2}}\n"
    )
    script = f"""
import torch, yaml
from attnx.model import TransformerConfig, build_transformer
from attnx.data.batch import collate
config = TransformerConfig.from_dict(yaml.safe_load(open({str(config)!r}))["transformer"])
model = build_transformer(config)
assert type(model.encoder_layers[0].self_attn).__name__ == "RestrictedSelfAttention"
torch.manual_seed(0)
pairs = [(torch.randint(4, 40, (n,)).tolist(), torch.randint(4, 40, (n,)).tolist()) for n in (5, 7, 6, 8)]
batch = collate(pairs)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
losses = []
for _ in range(30):
    logits = model(batch.src, batch.tgt_in, batch.src_mask)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.tgt_out, ignore_index=0)
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
print(losses[0], losses[-1])
assert losses[-1] < 0.5 * losses[0], losses
"""
    run(installed, "-c", script)
    out = run(installed, "-m", "attnx", "describe", "--config", str(config))
    assert "self-attention restricted" in out


def one_line_failure(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, cwd=cwd)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


MISSPELT = "{name: restricted, args: {windw: 8}}"
"""A plugin component with a misspelt constructor argument (`window`)."""


def assert_names_component_key_and_accepted(line: str) -> None:
    assert "attention component 'restricted'" in line and "attnx-restricted-attention" in line
    assert "'windw'" in line and "did you mean 'window'?" in line
    assert "accepted args: window, dropout" in line


def test_misspelt_plugin_argument_is_one_line_in_describe(installed, tmp_path):
    config = tmp_path / "restricted.yaml"
    config.write_text(
        f"model:\n  transformer:\n    d_model: 32\n    n_heads: 4\n    self_attention: {MISSPELT}\n"
    )
    line = one_line_failure(installed, "-m", "attnx", "describe", "--config", str(config))
    assert line.startswith("attnx describe: error:")
    assert_names_component_key_and_accepted(line)


def test_misspelt_plugin_argument_is_one_line_in_fit(installed, corpus: Path, tmp_path):
    config = tmp_path / "restricted.yaml"
    config.write_text(f"model:\n  transformer:\n    self_attention: {MISSPELT}\n")
    fit = [
        "-m",
        "attnx",
        "fit",
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        "--data.data_dir",
        str(corpus),
    ]
    for extra in (
        ["--config", str(config)],
        ["--model.transformer.self_attention", MISSPELT],
        ["--model.transformer.self_attention.name", "restricted"]
        + ["--model.transformer.self_attention.args", "{windw: 8}"],
    ):
        line = one_line_failure(installed, *fit, *extra, cwd=tmp_path)
        assert line.startswith("attnx fit: error:")
        assert_names_component_key_and_accepted(line)
    assert not (tmp_path / "runs").exists()
