"""CTranslate2 export: the exported weights score as attnx's own model does, positions included, for every
architecture the exporter takes; quantized exports load and translate; the directory holds what the engine
reads. How the engine decodes is tested with it, in tests/inference/test_ctranslate2.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from attnx.checkpoint import LoadedModel, load_model  # noqa: E402
from attnx.components.positional import sinusoid_table  # noqa: E402
from attnx.data.batch import EOS_ID  # noqa: E402
from attnx.export import ExportError, export_ctranslate2  # noqa: E402
from attnx.export.ctranslate2 import transformer_spec  # noqa: E402
from attnx.inference.config import SearchConfig  # noqa: E402
from attnx.inference.ctranslate2 import (  # noqa: E402
    FORMAT_VERSION,
    METADATA,
    CTranslate2Translator,
    is_ctranslate2_model,
)
from attnx.model import TransformerConfig, build_transformer  # noqa: E402
from tests.checkpoints import save_model  # noqa: E402
from tests.export.reference import attnx_log_probs, attnx_translate  # noqa: E402
from tests.trained import Pairs  # noqa: E402

GREEDY = SearchConfig(beam=1, max_len_a=1.0, max_len_b=50, max_positions=128)


def ct2_log_probs(
    ct2_translator: CTranslate2Translator, source: list[list[int]], target: list[list[int]]
) -> list[list[float]]:
    """CTranslate2's own log-probability of every target token and of the closing ``</s>``, per pair."""
    pieces = ct2_translator.pieces
    results = ctranslate2.Translator(str(ct2_translator.directory), intra_threads=1).score_batch(
        [[pieces[t] for t in x] for x in source], [[pieces[t] for t in y] for y in target], max_input_length=0
    )
    return [list(r.log_probs) for r in results]


def _max_diff(a: list[list[float]], b: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(torch.tensor(x) - y).abs() for x, y in zip(a, b, strict=True)])


def test_log_probs_equal_attnx(
    ct2_translator: CTranslate2Translator, loaded: LoadedModel, test_set: Pairs
) -> None:
    """Every reference token of the 200 test pairs, and each closing </s>, scored by both."""
    ours = ct2_log_probs(ct2_translator, test_set.sources, test_set.references)
    reference = attnx_log_probs(loaded.model, test_set.sources, test_set.references)
    diff = _max_diff(ours, reference)
    print(f"{diff.numel()} tokens: max |Δ log p| {diff.max():.2e}, mean {diff.mean():.2e}")
    assert diff.numel() == sum(len(y) + 1 for y in test_set.references)
    assert float(diff.max()) < 2e-5


def test_positions_are_attnx_sinusoids_from_position_zero(
    loaded: LoadedModel, test_set: Pairs, tmp_path: Path
):
    """CTranslate2's own sinusoid is laid out differently (halves, other frequencies, positions from 1), so the
    attnx table is written explicitly. With CTranslate2's table, or attnx's shifted by one position, the same
    weights score differently; with attnx's table from row 0 they score as attnx does."""
    from ctranslate2.specs import model_spec

    model, config, tokenizer = loaded.model, loaded.config, loaded.tokenizer
    table = sinusoid_table(config.max_len, config.d_model).float().numpy()
    sources, targets = test_set.sources[:20], test_set.references[:20]
    reference = attnx_log_probs(model, sources, targets)

    def score(name: str, encodings) -> float:
        spec = transformer_spec(model, config, tokenizer)
        assert (spec.encoder.position_encodings.encodings == table).all()
        assert (spec.decoder.position_encodings.encodings == table).all()
        spec.encoder.position_encodings.encodings = encodings
        spec.decoder.position_encodings.encodings = encodings
        spec.validate()
        spec.optimize()
        (tmp_path / name).mkdir()
        spec.save(str(tmp_path / name))
        pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        results = ctranslate2.Translator(str(tmp_path / name), intra_threads=1).score_batch(
            [[pieces[t] for t in x] for x in sources], [[pieces[t] for t in y] for y in targets]
        )
        return float(_max_diff([r.log_probs for r in results], reference).max())

    assert score("attnx", table) < 2e-5
    assert score("ctranslate2_own", model_spec.OPTIONAL) > 1e-2
    shifted = sinusoid_table(config.max_len + 1, config.d_model)[1:].float().numpy()
    assert score("from_one", shifted) > 1e-2


def _random_model(config: TransformerConfig, tokenizer, path: Path) -> LoadedModel:
    """A model whose every weight (norms included) is away from its initial value."""
    model = build_transformer(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_model(path, model, config, tokenizer)
    return load_model(path)


@pytest.mark.parametrize(
    "variant",
    [
        dict(norm_position="pre"),
        dict(share_embeddings=False),
        dict(positional={"name": "learned", "args": {}}, n_heads=2),
        dict(norm={"name": "layernorm", "args": {"eps": 1e-6}}, encoder_layers=1, decoder_layers=3),
        dict(positional={"name": "rotary"}),
        dict(positional={"name": "rotary", "args": {"dim": 4, "base": 100.0}}, norm_position="pre"),
        dict(positional={"name": "t5_relative", "args": {"buckets": 8, "max_distance": 16}}),
        dict(feedforward={"name": "swiglu"}),
        dict(feedforward={"name": "geglu", "args": {"bias": True}}),
        dict(norm={"name": "rmsnorm"}, norm_position="pre"),
        dict(output_bias=True),
        dict(feedforward={"name": "swish"}, positional={"name": "marian_sinusoidal"}, output_bias=True),
        dict(feedforward={"name": "gelu"}, positional={"name": "fairseq_sinusoidal"}, norm_position="pre"),
        dict(
            self_attention={"name": "multihead", "args": {"kv_heads": 2}},
            cross_attention={"name": "multihead", "args": {"kv_heads": 2}},
        ),
        dict(
            norm_position="pre",
            norm={"name": "rmsnorm"},
            feedforward={"name": "swiglu"},
            positional={"name": "rotary"},
            self_attention={"name": "multihead", "args": {"kv_heads": 1}},
            cross_attention={"name": "multihead", "args": {"kv_heads": 1}},
        ),
    ],
    ids=[
        "pre-norm",
        "unshared",
        "learned-2-heads",
        "eps-1e-6-1+3-layers",
        "rotary",
        "rotary-partial-pre",
        "t5-relative",
        "swiglu",
        "geglu-bias",
        "rmsnorm-pre",
        "output-bias",
        "marian-like",
        "m2m100-like",
        "gqa",
        "modern-mqa",
    ],
)
def test_other_architectures(variant: dict, loaded: LoadedModel, test_set: Pairs, tmp_path: Path) -> None:
    values = dict(
        vocab_size=loaded.config.vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=64,
        encoder_layers=2,
        decoder_layers=2,
    )
    config = TransformerConfig.from_dict(values | dict(dropout=0.0, max_len=128) | variant)
    model = _random_model(config, loaded.tokenizer, tmp_path / "model.ckpt")
    ct2_translator = CTranslate2Translator.load(
        export_ctranslate2(tmp_path / "model.ckpt", tmp_path / "ct2"), beam=1
    )
    sources, targets = test_set.sources[:20], test_set.references[:20]
    diff = _max_diff(
        ct2_log_probs(ct2_translator, sources, targets), attnx_log_probs(model.model, sources, targets)
    )
    assert float(diff.max()) < 2e-5
    assert ct2_translator.translate_ids(sources) == attnx_translate(model.model, sources, GREEDY)


def test_int8_export_loads_and_translates(trained: Path, test_set: Pairs, tmp_path: Path) -> None:
    out = export_ctranslate2(trained, tmp_path / "int8", quantization="int8")
    assert json.loads((out / METADATA).read_text())["quantization"] == "int8"
    lines = [*test_set.lines[:10], ""]
    translations = CTranslate2Translator.load(out, threads=1).translate(lines)
    assert len(translations) == len(lines) and translations[-1] == ""
    assert all(isinstance(t, str) for t in translations)


def test_directory_and_metadata(ct2_export: Path, trained: Path, loaded: LoadedModel, tmp_path: Path) -> None:
    meta = json.loads((ct2_export / METADATA).read_text())
    assert meta["format_version"] == FORMAT_VERSION
    assert TransformerConfig.from_dict(meta["transformer"]) == loaded.config
    assert meta["search"]["length_penalty"] == "fairseq" and meta["search"]["beam"] == 4
    # the checkpoint it was made from, which attnx translate checks before decoding constraints with it
    assert meta["source_checkpoint"] == trained.name
    assert meta["source_checkpoint_sha256"] == hashlib.sha256(trained.read_bytes()).hexdigest()
    assert meta["source_checkpoint_bytes"] == trained.stat().st_size
    assert (ct2_export / "sentencepiece.model").read_bytes() == loaded.tokenizer.to_bytes()
    vocabulary = json.loads((ct2_export / "shared_vocabulary.json").read_text())
    assert vocabulary[EOS_ID] == "</s>" and len(vocabulary) == loaded.config.vocab_size
    assert is_ctranslate2_model(ct2_export)
    assert not is_ctranslate2_model(tmp_path) and not is_ctranslate2_model(trained)
    replaced = shutil.copytree(ct2_export, tmp_path / "replaced")  # the shared export stays as it is
    with pytest.raises(ExportError, match="already exists"):
        export_ctranslate2(trained, replaced)
    assert export_ctranslate2(trained, replaced, force=True) == replaced
    with pytest.raises(ExportError, match="length_penalty='fairseq'"):
        export_ctranslate2(trained, tmp_path / "gnmt", search=SearchConfig())  # the paper's GNMT penalty
    with pytest.raises(ExportError, match="quantization 'int4'"):
        export_ctranslate2(trained, tmp_path / "q", quantization="int4")
    assert not (tmp_path / "q").exists() and not (tmp_path / "gnmt").exists()
