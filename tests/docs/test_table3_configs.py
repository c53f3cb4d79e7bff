"""Table 3's variations (A)-(E) as override configs: each, merged over the base config by the real ``attnx fit``
parser (``--print_config``), builds the model of its row.

Models are built on the ``meta`` device: shapes and parameter counts without allocating or initializing
168M parameters on a shared CPU.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
import yaml

from attnx.commands.lightning import main as attnx_cli
from attnx.components.positional import LearnedPositionalEncoding
from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters
from tests.conftest import REPO

BASE = REPO / "configs" / "base.yaml"
TABLE3 = REPO / "configs" / "table3"
VOCAB = 37000  # §5.1, the shared en-de BPE vocabulary the paper's parameter counts assume
PAPER_BASE_PARAMS = 65e6

# name -> (fields of model.transformer that the row sets, other model fields, the paper's parameters in M)
ROWS: dict[str, tuple[dict, dict, float | None]] = {
    "A_heads1": ({"n_heads": 1, "d_k": 512, "d_v": 512}, {}, 65),
    "A_heads4": ({"n_heads": 4, "d_k": 128, "d_v": 128}, {}, 65),
    "A_heads16": ({"n_heads": 16, "d_k": 32, "d_v": 32}, {}, 65),
    "A_heads32": ({"n_heads": 32, "d_k": 16, "d_v": 16}, {}, 65),
    "B_dk16": ({"d_k": 16, "d_v": 64}, {}, 58),
    "B_dk32": ({"d_k": 32, "d_v": 64}, {}, 60),
    "C_layers2": ({"encoder_layers": 2, "decoder_layers": 2}, {}, 36),
    "C_layers4": ({"encoder_layers": 4, "decoder_layers": 4}, {}, 50),
    "C_layers8": ({"encoder_layers": 8, "decoder_layers": 8}, {}, 80),
    "C_dmodel256": ({"d_model": 256, "d_k": 32, "d_v": 32}, {}, 28),
    "C_dmodel1024": ({"d_model": 1024, "d_k": 128, "d_v": 128}, {}, 168),
    "C_dff1024": ({"d_ff": 1024}, {}, 53),
    "C_dff4096": ({"d_ff": 4096}, {}, 90),
    "D_dropout0": ({"dropout": 0.0}, {}, None),
    "D_dropout02": ({"dropout": 0.2}, {}, None),
    "D_ls0": ({}, {"label_smoothing": 0.0}, None),
    "D_ls02": ({}, {"label_smoothing": 0.2}, None),
    "E_learned_positions": ({"positional": "learned"}, {}, None),
}


def parsed_model_section(*configs) -> dict:
    """``model`` of ``attnx fit --config ... --print_config``: the configs merged by jsonargparse, in order."""
    args = ["fit"] + [a for c in configs for a in ("--config", str(c))] + ["--print_config"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        attnx_cli(args)
    return yaml.safe_load(out.getvalue())["model"]


def build(transformer: dict):
    config = TransformerConfig.from_dict(transformer | {"vocab_size": VOCAB})
    with torch.device("meta"):
        return build_transformer(config)


@pytest.fixture(scope="module")
def base() -> tuple[dict, int]:
    model = parsed_model_section(BASE)
    return model, count_parameters(build(model["transformer"]))


def test_every_shipped_variation_is_tested():
    assert {p.stem for p in TABLE3.glob("*.yaml")} == set(ROWS)


@pytest.mark.parametrize("name", ROWS)
def test_table3_variation(name, base):
    base_model, base_params = base
    transformer_fields, model_fields, paper_params = ROWS[name]
    model_section = parsed_model_section(BASE, TABLE3 / f"{name}.yaml")
    transformer = model_section["transformer"]
    module = build(transformer)
    attn = module.encoder_layers[0].self_attn
    cross = module.decoder_layers[0].cross_attn
    for key, value in transformer_fields.items():
        if key in ("d_k", "d_v"):
            assert getattr(attn, key) == getattr(cross, key) == value, key
        elif key == "positional":
            assert transformer["positional"]["name"] == value
            assert isinstance(module.src_positional, LearnedPositionalEncoding)
        else:
            assert transformer[key] == value, key
    for key, value in model_fields.items():
        assert model_section[key] == value, key
    # Everything the row does not vary stays the base model's.
    unvaried = {k: v for k, v in base_model.items() if k not in model_fields and k != "transformer"}
    assert {k: model_section[k] for k in unvaried} == unvaried
    varied = set(transformer_fields) | {
        "self_attention",
        "cross_attention",
    }  # d_k, d_v live in the attention args
    for key, value in base_model["transformer"].items():
        if key not in varied:
            assert transformer[key] == value, key

    params = count_parameters(module)
    if paper_params is None:
        extra = (
            2 * transformer["max_len"] * transformer["d_model"] if "positional" in transformer_fields else 0
        )
        assert (
            params == base_params + extra
        )  # (D) changes no weight; (E) adds learned source/target positions
    else:
        # The paper rounds to millions and its vocabulary differs slightly from 37,000; compare each row's
        # change from the base model with the paper's change.
        paper_change = paper_params * 1e6 - PAPER_BASE_PARAMS
        assert abs((params - base_params) - paper_change) <= max(1e6, 0.03 * abs(paper_change)), params
