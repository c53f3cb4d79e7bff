"""docs/configs.md says what the shipped configs hold: its listing of base.yaml is the file (loggers and
callbacks abbreviated), its base/big table has the files' values, and the parameter counts it quotes are
those of the models the configs build."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters
from tests.conftest import REPO

PAGE = REPO / "docs" / "configs.md"
CONFIGS = REPO / "src" / "attnx" / "configs"
VOCAB = 37000  # the paper's shared en-de vocabulary, which the page's counts assume


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(title: str) -> str:
    return page().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text(encoding="utf-8"))


def short(class_path: str) -> str:
    return class_path.rsplit(".", 1)[-1]


def params_in_millions(name: str) -> float:
    section_ = load(name)["model"]["transformer"]
    with torch.device("meta"):
        model = build_transformer(TransformerConfig.from_dict(section_ | {"vocab_size": VOCAB}))
    return count_parameters(model) / 1e6


def test_the_base_listing_is_the_file():
    listing = re.search(r"```yaml\n(.*?)```", section("The paper's configs: base and big"), flags=re.S)
    assert listing, "no YAML listing of base.yaml on the page"
    shown = yaml.safe_load(listing.group(1))
    real = load("base.yaml")
    # loggers and callbacks are abbreviated on the page: class names, each callback with its init_args
    shown_loggers, shown_callbacks = shown["trainer"].pop("logger"), shown["trainer"].pop("callbacks")
    real_loggers, real_callbacks = real["trainer"].pop("logger"), real["trainer"].pop("callbacks")
    assert shown_loggers == [short(logger["class_path"]) for logger in real_loggers]
    assert shown_callbacks == [{short(c["class_path"]): c["init_args"]} for c in real_callbacks]
    assert shown == real


@pytest.mark.parametrize("name", ["base", "big"])
def test_the_base_and_big_table_has_the_files_values(name):
    table = section("The paper's configs: base and big")
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]+) \| ([^|]+) \|$", table, flags=re.M)
    assert len(rows) >= 5, "the base/big table lost its key rows"
    config = load(f"{name}.yaml")
    for key, base_value, big_value in rows:
        value = config
        for part in key.split("."):
            value = value[part]
        documented = (base_value if name == "base" else big_value).strip().replace(",", "")
        assert yaml.safe_load(documented) == value, (
            f"{key} of {name}.yaml is {value}, the page says {documented}"
        )


def test_quoted_parameter_counts_are_the_models():
    text = page()
    row = re.search(r"^\| parameters \(37k vocabulary\) \| ([\d.]+)M \| ([\d.]+)M \|$", text, flags=re.M)
    assert row, "the parameter row of the base/big table is gone"
    for quoted, name in zip(row.groups(), ["base.yaml", "big.yaml"], strict=True):
        digits = len(quoted.partition(".")[2])
        assert float(quoted) == round(params_in_millions(name), digits), f"{name}: page says {quoted}M"
    sentence = re.search(r"attnx's base model has ([\d.]+)M parameters", text)
    assert sentence and float(sentence.group(1)) == round(params_in_millions("base.yaml"), 1)
