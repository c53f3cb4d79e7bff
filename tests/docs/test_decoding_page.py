"""docs/decoding.md: its Python examples run as written (in order, one namespace) on tiny checkpoints, so
the page cannot drift from the API; what they print is not asserted (the models are untrained)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from attnx.model import build_transformer
from tests.checkpoints import save_model, train_tokenizer
from tests.conftest import REPO, tiny_config
from tests.inference.conftest import multi30k_lines

PAGE = REPO / "docs" / "decoding.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


@pytest.mark.slow  # untrained models decode to the page's maximum length (input + 50), with beam 5
def test_every_python_example_of_the_decoding_page_runs(shared_data: Path, tmp_path: Path, monkeypatch):
    lines = multi30k_lines(shared_data, "train.en.gz", 200) + multi30k_lines(shared_data, "train.de.gz", 200)
    tokenizer = train_tokenizer(lines, 150)
    config = tiny_config(vocab_size=tokenizer.vocab_size, max_len=64)
    for seed, name in enumerate(["model.ckpt", "run1/averaged.ckpt", "run2/averaged.ckpt"]):
        torch.manual_seed(seed)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        save_model(tmp_path / name, build_transformer(config), config, tokenizer)
    blocks = python_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 6, "the page lost its examples"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own examples
    assert os.getcwd() == str(tmp_path)
    hyps = namespace["translator"].generate(["A dog runs through the grass."])[0]
    assert len(hyps) == 3  # the page's beam 5, 3-best
    assert [j for _, j in namespace["hyp"].alignment] == list(range(len(namespace["hyp"].tokens)))
