"""What each export target refuses, before any weight is read, and how the output directory is written."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from attnx.checkpoint import read_checkpoint
from attnx.export import ExportError, export_ctranslate2, export_huggingface
from attnx.export.common import check_exportable, staged_output
from attnx.export.ctranslate2 import TARGET as CT2
from attnx.export.huggingface import TARGET as MARIAN
from attnx.files import WriteError
from attnx.model import TransformerConfig
from tests.conftest import tiny_config


def _config(**changes) -> TransformerConfig:
    return TransformerConfig.from_dict(tiny_config().to_dict() | changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"self_attention": {"name": "restricted", "args": {"window": 3}}}, "self_attention 'restricted' is not supported"),
        ({"cross_attention": {"name": "linear", "args": {}}}, "cross_attention 'linear' is not supported"),
        ({"feedforward": {"name": "mish", "args": {}}}, "feedforward 'mish' is not supported (CTranslate2 export supports 'relu' or 'swish' or 'gelu' or 'swiglu' or 'geglu')"),
        ({"positional": {"name": "alibi", "args": {}}}, "positional 'alibi' is not supported (CTranslate2 export supports 'sinusoidal' or 'marian_sinusoidal' or 'fairseq_sinusoidal' or 'learned' or 'rotary' or 't5_relative')"),
        ({"positional": {"name": "fairseq_sinusoidal", "args": {"offset": 2}}}, "positional 'fairseq_sinusoidal' with argument 'offset' is not supported"),
        ({"norm": {"name": "scalenorm", "args": {}}}, "norm 'scalenorm' is not supported"),
        ({"self_attention": {"name": "multihead", "args": {"kv_heads": 2}}}, "self_attention kv_heads=2 beside cross_attention kv_heads=4 is not supported (CTranslate2 gives a decoder layer's two attentions one count)"),
        ({"self_attention": {"name": "multihead", "args": {"d_k": 4}}}, "'multihead' with d_k=4"),
        ({"feedforward": {"name": "relu", "args": {"gate": True}}}, "'relu' with argument 'gate'"),
    ],
)  # fmt: skip
def test_unsupported_components_are_named(changes: dict, message: str) -> None:
    with pytest.raises(ExportError, match="cannot export to CTranslate2") as err:
        check_exportable(_config(**changes), CT2)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_every_problem_is_listed() -> None:
    config = _config(norm_position="pre", positional={"name": "learned", "args": {}})
    with pytest.raises(ExportError) as err:
        check_exportable(config, MARIAN)
    assert (
        "positional 'learned' is not supported (Hugging Face Marian export supports 'sinusoidal' or "
        "'marian_sinusoidal')" in str(err.value)
    )
    assert "norm_position 'pre' is not supported (Hugging Face Marian supports 'post')" in str(err.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"positional": {"name": "rotary", "args": {}}}, "positional 'rotary' is not supported (Hugging Face Marian export supports 'sinusoidal' or 'marian_sinusoidal')"),
        ({"positional": {"name": "fairseq_sinusoidal", "args": {}}}, "positional 'fairseq_sinusoidal' is not supported"),
        ({"positional": {"name": "t5_relative", "args": {}}}, "positional 't5_relative' is not supported"),
        ({"feedforward": {"name": "swiglu", "args": {}}}, "feedforward 'swiglu' is not supported (Hugging Face Marian export supports 'relu' or 'swish' or 'gelu')"),
        ({"feedforward": {"name": "geglu", "args": {}}}, "feedforward 'geglu' is not supported"),
        ({"norm": {"name": "rmsnorm", "args": {}}}, "norm 'rmsnorm' is not supported (Hugging Face Marian export supports 'layernorm')"),
        ({"self_attention": {"name": "multihead", "args": {"kv_heads": 1}}}, "self_attention 'multihead' with kv_heads=1 is not supported (Hugging Face Marian has one key/value head per query head, 4)"),
        ({"cross_attention": {"name": "multihead", "args": {"kv_heads": 2}}}, "cross_attention 'multihead' with kv_heads=2 is not supported"),
    ],
)  # fmt: skip
def test_marian_refuses_each_component_it_cannot_express_in_one_line_naming_it(changes, message) -> None:
    with pytest.raises(ExportError, match="cannot export to Hugging Face Marian") as err:
        check_exportable(_config(**changes), MARIAN)
    assert message in str(err.value) and "\n" not in str(err.value)
    check_exportable(_config(self_attention={"name": "multihead", "args": {"kv_heads": 4}}), MARIAN)


def test_ctranslate2_takes_what_marian_cannot() -> None:
    for changes in [
        {"norm_position": "pre"},
        {"positional": {"name": "learned", "args": {}}},
        {"norm": {"name": "layernorm", "args": {"eps": 1e-6}}},
        {"positional": {"name": "rotary", "args": {"dim": 4}}},
        {"positional": {"name": "t5_relative", "args": {"buckets": 16}}},
        {"feedforward": {"name": "swiglu", "args": {"bias": True}}},
        {"positional": {"name": "fairseq_sinusoidal", "args": {"padding_idx": 1}}},
        {"norm": {"name": "rmsnorm", "args": {"eps": 1e-5}}},
        {
            "self_attention": {"name": "multihead", "args": {"kv_heads": 2}},
            "cross_attention": {"name": "multihead", "args": {"kv_heads": 2}},
        },
    ]:
        check_exportable(_config(**changes), CT2)
        with pytest.raises(ExportError):
            check_exportable(_config(**changes), MARIAN)
    check_exportable(_config(self_attention={"name": "multihead", "args": {"d_k": 8, "bias": False}}), MARIAN)


def _with_plugin_attention(checkpoint: Path, path: Path) -> Path:
    """``checkpoint`` as if trained with an attention plugin that is not installed here."""
    data = read_checkpoint(checkpoint)
    data["attnx"]["transformer"]["self_attention"] = {"name": "restricted", "args": {"window": 3}}
    torch.save(data, path)
    return path


def test_plugin_model_is_refused_before_it_is_built(trained: Path, tmp_path: Path) -> None:
    """The plugin need not be installed: the config is checked first, and nothing is written."""
    pytest.importorskip("ctranslate2")
    path = _with_plugin_attention(trained, tmp_path / "plugin.ckpt")
    with pytest.raises(ExportError, match="self_attention 'restricted' is not supported"):
        export_ctranslate2(path, tmp_path / "ct2")
    pytest.importorskip("transformers")
    with pytest.raises(ExportError, match="self_attention 'restricted' is not supported"):
        export_huggingface(path, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plugin.ckpt"]


def test_staged_output(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with staged_output(out, force=False) as work:
        (work / "a").write_text("1")
        assert not out.exists()
    assert (out / "a").read_text() == "1"
    with pytest.raises(RuntimeError), staged_output(out, force=True) as work:
        (work / "b").write_text("2")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # old model kept, nothing half-written
    assert [p.name for p in out.iterdir()] == ["a"]
    with pytest.raises(ExportError, match="already exists"):
        staged_output(out, force=False).__enter__()


class SafetensorError(Exception):
    """What safetensors (Rust) raises on a full disk: no OSError, the errno in its message."""


@pytest.mark.parametrize(
    "full",
    [
        OSError(errno.ENOSPC, "No space left on device"),  # CTranslate2's writer, Path.write_bytes
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ],
)
def test_a_full_disk_is_one_line_naming_the_export_and_the_space(tmp_path: Path, full: Exception) -> None:
    out = tmp_path / "model"
    with pytest.raises(WriteError) as raised, staged_output(out, force=False) as work:
        (work / "a").write_text("1")
        raise full
    message = str(raised.value)
    assert message.startswith(f"cannot write export {out}: the disk is full (") and "\n" not in message
    assert f"MiB free in {tmp_path}" in message
    assert message.endswith(
        "nothing of it is left. Free disk space (or write elsewhere) and run the command again"
    )
    assert list(tmp_path.iterdir()) == []
    out.mkdir()
    (out / "old").write_text("0")
    with pytest.raises(WriteError, match=f"the previous {out} is kept"), staged_output(out, force=True):
        raise full
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and [p.name for p in out.iterdir()] == ["old"]
