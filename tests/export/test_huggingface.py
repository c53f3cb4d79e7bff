"""Hugging Face Marian export: ``transformers`` loads the directory offline, and the model computes attnx's
logits and greedy translations; its tokenizer gives attnx's ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from attnx.checkpoint import LoadedModel, load_model  # noqa: E402
from attnx.components.positional import sinusoid_table  # noqa: E402
from attnx.data.batch import EOS_ID, collate  # noqa: E402
from attnx.export import ExportError, export_huggingface  # noqa: E402
from attnx.export.huggingface import residual_permutation  # noqa: E402
from attnx.inference.config import SearchConfig  # noqa: E402
from attnx.model import TransformerConfig, build_transformer  # noqa: E402
from tests.checkpoints import save_model  # noqa: E402
from tests.export.reference import attnx_translate, top2_gap  # noqa: E402
from tests.trained import Pairs  # noqa: E402


@pytest.fixture(scope="module")
def exported(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_huggingface(trained, tmp_path_factory.mktemp("hf") / "marian")


@pytest.fixture(scope="module")
def marian(exported: Path):
    return transformers.MarianMTModel.from_pretrained(exported, local_files_only=True).eval()


def _logits_diff(model: torch.nn.Module, hf, sources: list[list[int]], targets: list[list[int]]) -> float:
    batch = collate(list(zip(sources, targets, strict=True)))
    with torch.inference_mode():
        ours = hf(
            input_ids=batch.src, attention_mask=batch.src_mask.long(), decoder_input_ids=batch.tgt_in
        ).logits
        reference = model.eval()(batch.src, batch.tgt_in, batch.src_mask)
    keep = batch.tgt_mask  # positions past a target's </s> are padding in both
    return float((ours[keep] - reference[keep]).abs().max())


def test_files_and_config(exported: Path, marian, loaded: LoadedModel) -> None:
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json"} <= names
    assert {"tokenizer_config.json", "generation_config.json"} <= names
    config = marian.config
    assert (config.decoder_start_token_id, config.pad_token_id, config.eos_token_id) == (2, 0, 3)
    assert config.scale_embedding and config.activation_function == "relu"
    assert config.share_encoder_decoder_embeddings
    assert config.max_position_embeddings == loaded.config.max_len
    assert json.loads((exported / "config.json").read_text())["normalize_before"] is False
    assert not marian.final_logits_bias.any()
    assert marian.lm_head.weight.data_ptr() == marian.model.shared.weight.data_ptr()
    # the SentencePiece model's identity travels with the export: sha256sum source.spm gives what attnx.json says
    recorded = json.loads((exported / "attnx.json").read_text())["tokenizer_sha256"]
    assert recorded == loaded.tokenizer.sha256
    for name in ("source.spm", "target.spm"):
        assert hashlib.sha256((exported / name).read_bytes()).hexdigest() == recorded


def test_positions_are_attnx_sinusoids_in_marian_order(marian, loaded: LoadedModel) -> None:
    """Marian's table has the sines in the first half and the cosines in the second, from position 0; attnx
    interleaves them. The permuted residual basis maps one onto the other exactly (up to float32 rounding of
    the two float64 computations)."""
    config = loaded.config
    table = sinusoid_table(config.max_len, config.d_model).float()
    marian_table = marian.model.encoder.embed_positions.weight.detach()
    perm = residual_permutation(config.d_model)
    assert not torch.allclose(marian_table, table, atol=1e-3)
    torch.testing.assert_close(marian_table, table[:, perm], rtol=0, atol=1e-6)
    torch.testing.assert_close(
        marian.model.decoder.embed_positions.weight.detach(), table[:, perm], rtol=0, atol=1e-6
    )


def test_logits_equal_attnx(marian, loaded: LoadedModel, test_set: Pairs) -> None:
    diff = _logits_diff(loaded.model, marian, test_set.sources[:32], test_set.references[:32])
    print(f"max |Δ logit| {diff:.1e}")
    assert diff < 1e-4


def test_greedy_generate_equals_attnx(marian, loaded: LoadedModel, test_set: Pairs) -> None:
    """``generate`` with one beam and room for 40 tokens and the </s> (``max_length`` counts the start token;
    the exported ``forced_eos_token_id`` ends a sentence at the limit as attnx does)."""
    sources = test_set.sources[:50]
    search = SearchConfig(beam=1, max_len_a=0.0, max_len_b=40, max_positions=loaded.config.max_len)
    reference = attnx_translate(loaded.model, sources, search)
    batch = collate([(x, []) for x in sources])
    with torch.inference_mode():
        generated = marian.generate(
            input_ids=batch.src,
            attention_mask=batch.src_mask.long(),
            num_beams=1,
            do_sample=False,
            max_length=42,
        )
    ours = []
    for row in generated.tolist():
        assert row[0] == 2  # decoding starts from <s>
        ids = row[1:]
        ours.append(ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids)
    differ = [i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b]
    for i in differ:
        step = next((t for t, (a, b) in enumerate(zip(ours[i], reference[i], strict=False)) if a != b), None)
        step = min(len(ours[i]), len(reference[i])) if step is None else step
        gap = top2_gap(loaded.model, sources[i], reference[i][:step])
        print(
            f"sentence {i}: outputs part at token {step}, where attnx's two best logits are {gap:.1e} apart"
        )
        assert gap < 1e-4, "greedy outputs may differ only where two tokens tie to float32 precision"
    assert len(differ) <= 0.02 * len(sources)


def test_tokenizer_gives_attnx_ids(exported: Path, loaded: LoadedModel, test_set: Pairs) -> None:
    tokenizer = transformers.MarianTokenizer.from_pretrained(exported, local_files_only=True)
    lines = test_set.lines[:20]
    encoded = tokenizer(lines)["input_ids"]
    assert encoded == [loaded.tokenizer.encode(line) + [EOS_ID] for line in lines]
    ids = test_set.references[:20]
    assert tokenizer.batch_decode(ids, skip_special_tokens=True) == [loaded.tokenizer.decode(x) for x in ids]


def test_unshared_embeddings(loaded: LoadedModel, test_set: Pairs, tmp_path: Path) -> None:
    """Separate source, target and output matrices: Marian's untied embeddings and lm_head."""
    config = TransformerConfig(
        vocab_size=loaded.config.vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=64,
        encoder_layers=1,
        decoder_layers=2,
        dropout=0.0,
        max_len=64,
        share_embeddings=False,
    )
    model = build_transformer(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_model(tmp_path / "unshared.ckpt", model, config, loaded.tokenizer)
    out = export_huggingface(tmp_path / "unshared.ckpt", tmp_path / "marian")
    hf = transformers.MarianMTModel.from_pretrained(out, local_files_only=True).eval()
    assert not hf.config.share_encoder_decoder_embeddings
    reference = load_model(tmp_path / "unshared.ckpt").model
    assert _logits_diff(reference, hf, test_set.sources[:8], test_set.references[:8]) < 1e-4


def test_existing_output(exported: Path, trained: Path) -> None:
    with pytest.raises(ExportError, match="already exists"):
        export_huggingface(trained, exported)


@pytest.mark.parametrize(
    "variant",
    [
        dict(feedforward={"name": "swish"}, positional={"name": "marian_sinusoidal"}, output_bias=True),
        dict(feedforward={"name": "gelu"}, output_bias=True),
    ],
    ids=["marian-like", "gelu-bias"],
)
def test_swish_gelu_marian_positions_and_the_output_bias(
    variant: dict, loaded: LoadedModel, test_set: Pairs, tmp_path: Path
) -> None:
    """Marian's own activations and table, and its final_logits_bias: `marian_sinusoidal` needs no permutation."""
    values = dict(
        vocab_size=loaded.config.vocab_size, d_model=32, n_heads=4, d_ff=64, dropout=0.0, max_len=64
    )
    config = TransformerConfig.from_dict(values | dict(encoder_layers=1, decoder_layers=2) | variant)
    model = build_transformer(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_model(tmp_path / "model.ckpt", model, config, loaded.tokenizer)
    out = export_huggingface(tmp_path / "model.ckpt", tmp_path / "marian")
    hf = transformers.MarianMTModel.from_pretrained(out, local_files_only=True).eval()
    assert hf.config.activation_function == config.feedforward.name
    torch.testing.assert_close(hf.final_logits_bias[0], model.output_bias.detach(), rtol=0, atol=0)
    reference = load_model(tmp_path / "model.ckpt").model
    diff = _logits_diff(reference, hf, test_set.sources[:8], test_set.references[:8])
    print(f"{variant}: max |Δ logit| {diff:.1e}")
    assert diff < 1e-4
