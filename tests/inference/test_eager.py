"""The eager engine: n-best with text, sampling, ensembles of checkpoints, forced scoring, prefixes, alignments,
batches by tokens, attention maps."""

from __future__ import annotations

import pytest
import torch

import attnx
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.eager import EagerTranslator, token_batches
from attnx.inference.hypothesis import Hypothesis
from attnx.model import build_transformer
from tests.checkpoints import save_model, train_tokenizer
from tests.conftest import tiny_config
from tests.inference.conftest import multi30k_lines
from tests.inference.test_translator import LINES as MIXED_LINES

LINES = ["A man rides a bike.", "", "Two dogs play in the snow.", "A girl in a red dress is jumping."]
FAST = SearchConfig(beam=4, nbest=3, max_len_b=6)


@pytest.fixture(scope="module")
def other_checkpoint(checkpoint, tokenizer, tmp_path_factory):
    """A second model with the same SentencePiece model and other weights."""
    torch.manual_seed(7)
    config = tiny_config(vocab_size=tokenizer.vocab_size, max_len=64)
    path = tmp_path_factory.mktemp("other") / "other.ckpt"
    save_model(path, build_transformer(config), config, tokenizer)
    return path


@pytest.fixture(scope="module")
def foreign_checkpoint(shared_data, tmp_path_factory):
    """A model with a SentencePiece model of its own (same vocabulary size, other pieces)."""
    tokenizer = train_tokenizer(multi30k_lines(shared_data, "train.de.gz", 400), 200, model_type="unigram")
    config = tiny_config(vocab_size=tokenizer.vocab_size, max_len=64)
    path = tmp_path_factory.mktemp("foreign") / "foreign.ckpt"
    save_model(path, build_transformer(config), config, tokenizer)
    return path


def test_generate_gives_nbest_hypotheses_with_text_and_blank_for_blank(checkpoint):
    translator = attnx.load(checkpoint, search=FAST)
    results = translator.generate(LINES)
    assert len(results) == len(LINES)
    assert results[1] == [Hypothesis([], 0.0, 0.0, text="")]
    for i in (0, 2, 3):
        hyps = results[i]
        assert len(hyps) == 3 and hyps[0].score >= hyps[1].score >= hyps[2].score
        assert [h.text for h in hyps] == [translator.decode(h.tokens) for h in hyps]
    one_best = translator.with_search(nbest=1)
    assert one_best.translate(LINES) == [hyps[0].text for hyps in results]
    assert one_best.translate_ids(one_best.encode(LINES)) == [hyps[0].tokens for hyps in results]


def test_sampling_through_the_translator_is_reproducible_with_a_seed(checkpoint):
    sampler = attnx.load(checkpoint, search=SearchConfig(sampling=True, nbest=4, seed=11, max_len_b=6))
    first, again = sampler.generate(LINES), sampler.generate(LINES)
    assert [[h.text for h in hyps] for hyps in first] == [[h.text for h in hyps] for hyps in again]
    other = sampler.with_search(seed=12).generate(LINES)
    assert [[h.tokens for h in hyps] for hyps in first] != [[h.tokens for h in hyps] for hyps in other]
    assert all(len(hyps) == 4 for i, hyps in enumerate(first) if LINES[i])


def test_score_gives_back_the_search_scores_of_its_outputs(checkpoint):
    translator = attnx.load(checkpoint, search=FAST)
    results = translator.generate(LINES)
    sources = [line for line, hyps in zip(LINES, results, strict=True) if line for _ in hyps]
    targets = [h.text for line, hyps in zip(LINES, results, strict=True) if line for h in hyps]
    flat = [h for line, hyps in zip(LINES, results, strict=True) if line for h in hyps]
    scored = translator.score(sources, targets)
    for searched, forced in zip(flat, scored, strict=True):
        if forced.tokens == searched.tokens:  # text re-encodes to the same pieces (almost always)
            assert forced.score == pytest.approx(searched.score, abs=1e-4)
            assert forced.log_prob == pytest.approx(searched.log_prob, abs=1e-4)
        assert forced.text == searched.text
    with pytest.raises(ValueError, match="1 targets for 2 sources"):
        translator.score(["a", "b"], ["c"])


def test_alignments_of_outputs_equal_those_of_forced_scoring(checkpoint):
    aligner = attnx.load(checkpoint, search=SearchConfig(beam=2, nbest=2, max_len_b=6, alignment=True))
    results = aligner.generate(LINES)
    assert results[1][0].alignment is None  # blank line: nothing decoded
    n_pieces = [len(ids) for ids in aligner.encode(LINES)]
    for i in (0, 2, 3):
        for h in results[i]:
            assert [j for _, j in h.alignment] == list(range(len(h.tokens)))
            assert all(0 <= a < n_pieces[i] for a, _ in h.alignment)
            if aligner.encode([h.text])[0] == h.tokens:  # the text re-encodes to the same pieces
                assert aligner.score([LINES[i]], [h.text])[0].alignment == h.alignment


def test_a_prefix_per_line_starts_every_translation(checkpoint):
    translator = attnx.load(checkpoint, search=FAST)
    results = translator.generate(LINES, prefixes=["Ein Mann", "", "", "Ein"])
    for i, prefix in [(0, "Ein Mann"), (3, "Ein")]:
        ids = translator.encode([prefix])[0]
        assert all(h.tokens[: len(ids)] == ids and h.text.startswith(prefix) for h in results[i])
    with pytest.raises(ValueError, match="one prefix per line"):
        translator.generate(LINES, prefixes=["Ein"])


def test_an_ensemble_of_a_checkpoint_with_itself_equals_the_checkpoint(checkpoint, other_checkpoint):
    alone = attnx.load(checkpoint, search=FAST)
    twice = attnx.load([checkpoint, checkpoint], search=FAST)
    assert isinstance(twice, EagerTranslator) and len(twice.models) == 2
    a, b = alone.generate(LINES), twice.generate(LINES)
    assert [[h.text for h in hyps] for hyps in a] == [[h.text for h in hyps] for hyps in b]
    assert [h.score for hyps in a for h in hyps] == pytest.approx(
        [h.score for hyps in b for h in hyps], abs=1e-4
    )
    pair = attnx.load([checkpoint, other_checkpoint], search=FAST, weights=[1, 1])
    mixed = pair.score(LINES, ["Ein Mann."] * 4)
    single = [t.score(LINES, ["Ein Mann."] * 4) for t in (alone, attnx.load(other_checkpoint, search=FAST))]
    for m, s1, s2 in zip(mixed, *single, strict=True):
        # log of a mean of probabilities lies between the two models' log-probabilities, per token
        for lm, l1, l2 in zip(m.token_log_probs, s1.token_log_probs, s2.token_log_probs, strict=True):
            assert min(l1, l2) - 1e-5 <= lm <= max(l1, l2) + 1e-5
    with pytest.raises(ValueError, match="attention maps are drawn for one model"):
        pair.attention("A dog.")


def test_an_ensemble_of_different_sentencepiece_models_is_one_line_naming_both(
    checkpoint, foreign_checkpoint
):
    with pytest.raises(ValueError) as err:
        attnx.load([checkpoint, foreign_checkpoint])
    message = str(err.value)
    assert str(checkpoint) in message and str(foreign_checkpoint) in message and "\n" not in message
    assert "different SentencePiece models" in message
    with pytest.raises(ValueError, match="ensemble weights need an ensemble"):
        attnx.load(checkpoint, weights=[1.0])


def test_an_ensemble_of_the_same_sentencepiece_model_in_other_bytes_decodes(checkpoint, tmp_path):
    """Checkpoints of the same corpus prepared in two folders carried models that differed only in the training
    folder they recorded: one model as far as ids go, and an ensemble of them decodes."""
    from attnx.data.sentencepiece_proto import parse

    state = torch.load(checkpoint, weights_only=True)
    model = parse(bytes(state["attnx"]["tokenizer"]))
    model.trainer_spec.model_prefix = "/elsewhere/.attnx-prepare-3kq0z1xb/spm"
    state["attnx"]["tokenizer"] = model.SerializeToString()
    del state["attnx"]["tokenizer_sha256"]  # as written before the hash was recorded
    elsewhere = tmp_path / "elsewhere.ckpt"
    torch.save(state, elsewhere)
    pair = attnx.load([checkpoint, elsewhere], search=FAST)
    assert pair.translate(LINES) == attnx.load(checkpoint, search=FAST).translate(LINES)


def test_bf16_mixed_decodes_its_matrix_products_in_bf16_and_scores_as_it_searched(checkpoint):
    bf16 = attnx.load(checkpoint, search=FAST, precision="bf16-mixed")
    fp32 = attnx.load(checkpoint, search=FAST)
    dtypes: dict[str, set[torch.dtype]] = {"bf16": set(), "fp32": set()}
    handles = [
        next(m for m in t.model.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(
            lambda module, args, out, seen=seen: seen.add(out.dtype)
        )
        for t, seen in ((bf16, dtypes["bf16"]), (fp32, dtypes["fp32"]))
    ]
    try:
        results = bf16.generate(LINES)
        fp32.generate(LINES)
        pairs = [(line, h) for line, hyps in zip(LINES, results, strict=True) for h in hyps if h.tokens]
        # scored by ids: a random model's output text need not re-encode to the same pieces
        sources = bf16.truncate(bf16.encode([line for line, _ in pairs]))
        scored = bf16.score_ids(sources, [h.tokens for _, h in pairs])
    finally:
        for handle in handles:
            handle.remove()
    assert dtypes == {"bf16": {torch.bfloat16}, "fp32": {torch.float32}}
    assert pairs and all(isinstance(h.score, float) for hyps in results for h in hyps)
    # the forced pass runs other shapes than the search, so bf16 rounds differently: equal to about 1%
    for (_, hyp), forced in zip(pairs, scored, strict=True):
        assert forced.log_prob == pytest.approx(hyp.log_prob, rel=0.01, abs=0.05)
    assert bf16.with_search(beam=1, nbest=1).precision == "bf16-mixed"


def test_16_mixed_needs_a_cuda_device_and_an_unknown_precision_is_named(checkpoint):
    with pytest.raises(ConfigError, match="16-mixed decodes on CUDA devices"):
        attnx.load(checkpoint, precision="16-mixed")
    with pytest.raises(ConfigError, match="choose one of auto, 32-true, bf16-mixed, 16-mixed"):
        attnx.load(checkpoint, precision="bf16")


def test_token_batches_respect_the_budget_and_cover_every_line_once():
    lengths = [5, 30, 2, 9, 9, 50, 1, 70]
    batches = list(token_batches(lengths, max_tokens=60))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 60
    assert [len(b) for b in batches] == [5, 1, 1, 1]  # shortest first; a line over budget goes alone


def test_batching_by_tokens_does_not_change_the_output(checkpoint):
    small = attnx.load(checkpoint, search=SearchConfig(beam=2, max_len_b=6), max_tokens=8)
    assert small.translate(MIXED_LINES) == attnx.load(
        checkpoint, search=SearchConfig(beam=2, max_len_b=6)
    ).translate(MIXED_LINES)


def test_attention_collects_every_layer(checkpoint, loaded):
    translator = attnx.load(checkpoint, search=SearchConfig(beam=2, max_len_b=6))
    maps = translator.attention("A man in an orange hat.")
    heads, s, t = loaded.config.n_heads, len(maps.source_tokens), len(maps.target_tokens)
    assert maps.source_tokens[-1] == maps.target_tokens[-1] == "</s>"
    assert [w.shape for w in maps.encoder] == [(heads, s, s)] * loaded.config.encoder_layers
    assert [w.shape for w in maps.cross] == [(heads, t, s)] * loaded.config.decoder_layers
    torch.testing.assert_close(maps.cross[0].sum(-1), torch.ones(heads, t))  # rows are distributions
    assert maps.translation == translator.translate(["A man in an orange hat."])[0]
    with pytest.raises(ValueError, match="non-empty"):
        translator.attention("  ")
