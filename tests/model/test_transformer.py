"""§3 The whole model: reference agreement, no leaks, padding, incremental decoding and its cache, shared weights,
embeddings scaled."""

from __future__ import annotations

import pytest
import torch

from attnx.data.batch import BOS_ID, collate
from attnx.inference.decoder import ModelDecoder
from attnx.model import build_transformer
from attnx.model.builders import count_parameters
from tests.conftest import tiny_config
from tests.model.reference import transformer_logits


def pair_batch(vocab: int = 50):
    src = torch.randint(4, vocab, (3, 9))
    lengths = torch.tensor([9, 6, 4])
    src_mask = torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)
    src = src.masked_fill(~src_mask, 0)
    tgt_in = torch.randint(4, vocab, (3, 7))
    return src, src_mask, lengths, tgt_in


def sources(*lengths: int, vocab: int = 50):
    """A padded batch of random sources of the given lengths (ids >= 4), EOS appended."""
    gen = torch.Generator().manual_seed(sum(lengths))
    ids = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in lengths]
    batch = collate([(x, []) for x in ids])
    return batch.src, batch.src_mask


def test_matches_float64_reference():
    model = build_transformer(tiny_config()).double().eval()
    src, src_mask, lengths, tgt_in = pair_batch()
    logits = model(src, tgt_in, src_mask)
    for b in range(3):
        expected = transformer_logits(model, src[b], int(lengths[b]), tgt_in[b], heads=4)
        torch.testing.assert_close(logits[b], expected, rtol=1e-9, atol=1e-9)


def test_future_targets_do_not_leak_into_earlier_positions():
    model = build_transformer(tiny_config()).eval()
    src, src_mask, _, tgt_in = pair_batch()
    before = model(src, tgt_in, src_mask)
    for i in range(1, tgt_in.shape[1]):
        changed = tgt_in.clone()
        changed[:, i:] = torch.randint(4, 50, changed[:, i:].shape)
        after = model(src, changed, src_mask)
        torch.testing.assert_close(after[:, :i], before[:, :i], rtol=0, atol=1e-6)
        assert not torch.allclose(after[:, i:], before[:, i:])


def test_padding_changes_no_real_position():
    model = build_transformer(tiny_config()).eval()
    src, src_mask, _, tgt_in = pair_batch()
    before = model(src, tgt_in, src_mask)
    memory = model.encode(src, src_mask)
    noisy = src.masked_fill(~src_mask, 17)  # different tokens at padded positions only
    after = model(noisy, tgt_in, src_mask)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.encode(noisy, src_mask)[src_mask], memory[src_mask], rtol=0, atol=1e-6)
    # A sentence decoded alone, unpadded, equals its row in the padded batch.
    alone = model(src[2:3, :4], tgt_in[2:3], src_mask[2:3, :4])
    torch.testing.assert_close(alone[0], before[2], rtol=0, atol=1e-5)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("positional", ["sinusoidal", "marian_sinusoidal", "fairseq_sinusoidal", "learned"])
def test_incremental_decoding_equals_full_pass(norm_position, positional):
    config = tiny_config(norm_position=norm_position)
    config.positional.name = positional
    model = build_transformer(config).eval()
    src, src_mask, _, tgt_in = pair_batch()
    full = model(src, tgt_in, src_mask)
    state = model.start_decoding(model.encode(src, src_mask), src_mask)
    for i in range(tgt_in.shape[1]):
        step = model.decode_step(tgt_in[:, i], state)
        torch.testing.assert_close(step, full[:, i], rtol=1e-5, atol=1e-5)


def test_decode_step_returns_the_cross_attention_of_the_full_pass_when_asked():
    model = build_transformer(tiny_config()).eval()
    src, src_mask, _, tgt_in = pair_batch()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full: list[torch.Tensor] = []
        logits = model.decode(tgt_in, memory, src_mask, weights=full)  # per layer (B, H, T, S)
        state = model.start_decoding(memory, src_mask)
        for i in range(tgt_in.shape[1]):
            weights: list[torch.Tensor] = []
            step = model.decode_step(tgt_in[:, i], state, weights=weights)
            torch.testing.assert_close(step, logits[:, i], rtol=1e-5, atol=1e-5)
            assert len(weights) == len(model.decoder_layers)
            for layer, w in enumerate(weights):
                torch.testing.assert_close(w[:, :, 0], full[layer][:, :, i], rtol=1e-5, atol=1e-5)
                assert bool(
                    (w[:, :, 0][~src_mask.unsqueeze(1).expand_as(w[:, :, 0])] == 0).all()
                )  # no padding


def test_decode_features_computes_the_weights_of_one_layer_only_when_asked(monkeypatch: pytest.MonkeyPatch):
    """Guided alignment's seam: `weights_layer` gives that layer's encoder-decoder attention, the same as a pass
    asking every layer's, and the other layers run without explicit weights."""
    model = build_transformer(tiny_config(decoder_layers=3)).eval()
    src, src_mask, _, tgt_in = pair_batch()
    explicit: list[bool] = []
    forward = type(model.decoder_layers[0].cross_attn).forward

    def recorded(self, *args, need_weights: bool = False, **kwargs):
        if any(self is layer.cross_attn for layer in model.decoder_layers):
            explicit.append(need_weights)
        return forward(self, *args, need_weights=need_weights, **kwargs)

    with torch.no_grad():
        memory = model.encode(src, src_mask)
        every: list[torch.Tensor] = []
        features = model.decode_features(tgt_in, memory, src_mask, weights=every)
        monkeypatch.setattr(type(model.decoder_layers[0].cross_attn), "forward", recorded)
        for layer in (1, -1):
            one: list[torch.Tensor] = []
            explicit.clear()
            same = model.decode_features(tgt_in, memory, src_mask, weights=one, weights_layer=layer)
            assert len(one) == 1 and explicit == [i == layer % 3 for i in range(3)]
            torch.testing.assert_close(one[0], every[layer])
            torch.testing.assert_close(same, features, rtol=1e-5, atol=1e-5)
        with pytest.raises(IndexError, match="decoder layer 3 does not exist: the decoder has 3 layers"):
            model.decode_features(tgt_in, memory, src_mask, weights=[], weights_layer=3)


def test_cache_follows_reorder():
    model = build_transformer(tiny_config()).eval()
    src, src_mask, _, tgt_in = pair_batch()
    full = model(src, tgt_in, src_mask)
    state = model.start_decoding(model.encode(src, src_mask), src_mask)
    for i in range(3):
        model.decode_step(tgt_in[:, i], state)
    order = torch.tensor([2, 0])
    state.reorder(order)
    step = model.decode_step(tgt_in[order, 3], state)
    torch.testing.assert_close(step, full[order, 3], rtol=1e-5, atol=1e-5)


def test_cached_decode_step_equals_full_recomputation_also_after_reorder():
    model = build_transformer(tiny_config()).eval()
    src, src_mask = sources(5, 9, 7)
    gen = torch.Generator().manual_seed(1)
    prefix = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 50, (3, 8), generator=gen)], 1)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        state = model.start_decoding(memory, src_mask)
        for i in range(5):
            step = model.decode_step(prefix[:, i], state)
            full = model.decode(prefix[:, : i + 1], memory, src_mask)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
        # beam-style reorder: rows 2, 0, 0 continue; the cache must follow them
        index = torch.tensor([2, 0, 0])
        state.reorder(index)
        prefix, memory, src_mask = prefix[index], memory[index], src_mask[index]
        for i in range(5, 9):
            step = model.decode_step(prefix[:, i], state)
            full = model.decode(prefix[:, : i + 1], memory, src_mask)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_beam_reorder_within_sentences_moves_only_the_self_attention_cache():
    model = build_transformer(tiny_config()).eval()
    src, src_mask = sources(5, 9)
    gen = torch.Generator().manual_seed(2)
    prefix = torch.cat([torch.full((4, 1), BOS_ID), torch.randint(4, 50, (4, 6), generator=gen)], 1)
    with torch.no_grad():
        memory = model.encode(src, src_mask).repeat_interleave(2, 0)  # rows 0-1: sentence 0, 2-3: 1
        mask = src_mask.repeat_interleave(2, 0)
        state = model.start_decoding(model.encode(src, src_mask), src_mask)
        state.reorder(torch.arange(2).repeat_interleave(2))  # each sentence twice, as the beam does
        for i in range(3):
            model.decode_step(prefix[:, i], state)
        index = torch.tensor([1, 1, 3, 2])  # back-pointers within each sentence
        cross_before = state.caches[0][1].k
        state.reorder(index, same_sources=True)
        assert state.caches[0][1].k is cross_before  # the source side was not copied
        prefix = prefix[index]
        for i in range(3, 6):
            step = model.decode_step(prefix[:, i], state)
            full = model.decode(prefix[:, : i + 1], memory, mask)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_one_weight_matrix_is_shared():
    model = build_transformer(tiny_config())
    assert model.src_embedding.weight is model.tgt_embedding.weight
    assert model.output_weight is model.src_embedding.weight
    # One tensor: a change through one view is seen by the others, and it is counted once.
    with torch.no_grad():
        model.src_embedding.weight[5, 0] = 123.0
    assert model.output_weight[5, 0] == 123.0
    unshared = build_transformer(tiny_config(share_embeddings=False))
    assert unshared.src_embedding.weight is not unshared.tgt_embedding.weight
    assert count_parameters(unshared) - count_parameters(model) == 2 * 50 * 32


def test_embeddings_scaled_by_sqrt_d_model():
    model = build_transformer(tiny_config()).eval()
    tokens = torch.tensor([[7]])
    x = model.src_embedding(tokens) * 32**0.5
    expected = model.src_positional(x)
    got = model._embed(tokens, model.src_embedding, model.src_positional)
    torch.testing.assert_close(got, expected)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
    reason="the flash kernel in bf16 needs a CUDA device of compute capability 8.0 or newer",
)
def test_a_cuda_training_step_and_decoding_run_no_cudnn_attention_and_leave_the_switch_on():
    """The Transformer chooses the attention kernels once a pass: no attention call sets a flag, and still no
    cuDNN attention kernel runs, in training (padded sources) or in incremental decoding."""
    from torch.profiler import ProfilerActivity, profile

    model = build_transformer(tiny_config(d_model=256, n_heads=4, d_ff=512)).cuda()
    src = torch.randint(4, 50, (32, 40), device="cuda")
    src_mask = torch.arange(40, device="cuda") < torch.randint(1, 41, (32, 1), device="cuda")
    tgt = torch.randint(4, 50, (32, 30), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(src, tgt, src_mask).float().sum().backward()  # kernels loaded before the profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(src, tgt, src_mask).float().sum().backward()
            with torch.no_grad():
                state = model.start_decoding(model.encode(src, src_mask), src_mask)
                for _ in range(3):
                    model.decode_step(tgt[:, 0], state)
            torch.cuda.synchronize()
    names = [event.key for event in prof.key_averages()]
    assert not [name for name in names if "cudnn" in name.lower() and "sdpa" in name.lower()], names
    assert [name for name in names if "flash" in name.lower() or "fmha" in name.lower()], names
    assert torch.backends.cuda.cudnn_sdp_enabled()


def spec(name: str, **args):
    from attnx.model.builders import ComponentSpec

    return ComponentSpec(name, args)


VARIANTS = {
    "rotary": dict(positional=spec("rotary")),
    "rotary-partial": dict(positional=spec("rotary", dim=4, base=100.0)),
    "t5_relative": dict(positional=spec("t5_relative", buckets=8, max_distance=12)),
    "gqa": dict(self_attention=spec("multihead", kv_heads=2), cross_attention=spec("multihead", kv_heads=2)),
    "mqa": dict(self_attention=spec("multihead", kv_heads=1), cross_attention=spec("multihead", kv_heads=1)),
    "swiglu": dict(feedforward=spec("swiglu")),
    "geglu": dict(feedforward=spec("geglu", bias=True)),
    "rmsnorm": dict(norm=spec("rmsnorm")),
    "swish": dict(feedforward=spec("swish")),
    "gelu": dict(feedforward=spec("gelu")),
    "marian_sinusoidal": dict(positional=spec("marian_sinusoidal")),
    "fairseq_sinusoidal": dict(positional=spec("fairseq_sinusoidal", padding_idx=1)),
    "output_bias": dict(output_bias=True),
    "marian-like": dict(feedforward=spec("swish"), positional=spec("marian_sinusoidal"), output_bias=True),
    "m2m100-like": dict(norm_position="pre", positional=spec("fairseq_sinusoidal"), share_embeddings=False),
    "modern": dict(
        norm_position="pre",
        norm=spec("rmsnorm"),
        feedforward=spec("swiglu"),
        positional=spec("rotary"),
        self_attention=spec("multihead", kv_heads=2),
        cross_attention=spec("multihead", kv_heads=2),
    ),
    "t5-like": dict(
        norm_position="pre",
        norm=spec("rmsnorm"),
        feedforward=spec("geglu"),
        positional=spec("t5_relative"),
        self_attention=spec("multihead", kv_heads=1),
    ),
}
"""Every new component alone, and two combinations, as config overrides of the tiny model."""


def variant(name: str, dtype=torch.float32):
    torch.manual_seed(0)
    model = build_transformer(tiny_config(**VARIANTS[name])).to(dtype).eval()
    with torch.no_grad():  # a relative bias table starts at zero: give it values, so positions count
        for module in model.modules():
            if getattr(module, "acts_on", None) == "scores":
                for p in module.parameters():
                    p.normal_()
        if model.output_bias is not None:  # zeros too when built
            model.output_bias.normal_()
    return model


@pytest.mark.parametrize("name", VARIANTS)
def test_every_component_decodes_incrementally_as_the_full_pass_even_after_reorder(name):
    model = variant(name)
    src, src_mask = sources(5, 9, 7)
    gen = torch.Generator().manual_seed(1)
    prefix = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 50, (3, 8), generator=gen)], 1)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(prefix, memory, src_mask)
        state = model.start_decoding(memory, src_mask)
        for i in range(5):
            torch.testing.assert_close(
                model.decode_step(prefix[:, i], state), full[:, i], atol=1e-5, rtol=1e-5
            )
        index = torch.tensor([2, 0, 0])
        state.reorder(index)
        prefix, memory, src_mask = prefix[index], memory[index], src_mask[index]
        for i in range(5, 9):
            step = model.decode_step(prefix[:, i], state)
            whole = model.decode(prefix[:, : i + 1], memory, src_mask)[:, -1]
            torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-5)


class Recomputing(ModelDecoder):
    """A decoder without a cache: every step runs the decoder over the whole prefix again."""

    def start(self, src, src_mask):
        return {"memory": self.model.encode(src, src_mask), "src_mask": src_mask, "prefix": src[:, :0]}

    def step(self, tokens, state):
        state["prefix"] = torch.cat([state["prefix"], tokens.unsqueeze(1)], 1)
        logits = self.model.decode(state["prefix"], state["memory"], state["src_mask"])[:, -1]
        return torch.log_softmax(logits.to(torch.float64), -1)

    def reorder(self, state, index, same_sources=False):
        for key in state:
            state[key] = state[key].index_select(0, index)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_search_with_the_cache_equal_recomputing_the_whole_prefix(name, beam):
    from attnx.inference.config import SearchConfig
    from attnx.inference.search import generate

    model = variant(name, torch.float64)
    src, src_mask = sources(5, 9, 7)
    config = SearchConfig(beam=beam, max_len_a=0.0, max_len_b=8, nbest=beam)
    with torch.no_grad():
        cached = generate(model, src, src_mask, config)
        recomputed = generate(Recomputing(model), src, src_mask, config)
    for mine, theirs in zip(cached, recomputed, strict=True):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-9)


def saved_bytes_and_gradients(
    checkpointing: bool, norm_position: str, **components
) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes the forward pass saves for the backward pass, and the gradients, of one training pass with
    dropout on (the same seed both ways)."""
    config = tiny_config(
        dropout=0.3, activation_checkpointing=checkpointing, norm_position=norm_position, **components
    )
    torch.manual_seed(0)
    model = build_transformer(config).train()
    src, src_mask, _, tgt_in = pair_batch()
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(src, tgt_in, src_mask)
        total = sum(saved)
    logits.logsumexp(-1).sum().backward()
    return total, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_activation_checkpointing_keeps_less_and_gives_the_same_gradients(norm_position: str):
    plain_bytes, plain = saved_bytes_and_gradients(False, norm_position)
    checked_bytes, checked = saved_bytes_and_gradients(True, norm_position)
    assert checked_bytes < plain_bytes / 2  # each layer keeps its inputs only
    for name, grad in plain.items():
        assert torch.equal(checked[name], grad), name  # the dropout masks drawn again are the same


@pytest.mark.parametrize("name", ["modern", "t5-like"])
def test_activation_checkpointing_recomputes_positions_inside_attention_alike(name: str):
    components = {k: v for k, v in VARIANTS[name].items() if k != "norm_position"}
    position = VARIANTS[name].get("norm_position", "post")
    plain_bytes, plain = saved_bytes_and_gradients(False, position, **components)
    checked_bytes, checked = saved_bytes_and_gradients(True, position, **components)
    assert checked_bytes < plain_bytes
    for name_, grad in plain.items():
        assert grad is not None and torch.equal(checked[name_], grad), name_


def test_activation_checkpointing_leaves_evaluation_alone():
    model = build_transformer(tiny_config(activation_checkpointing=True)).eval()
    reference = build_transformer(tiny_config())
    reference.load_state_dict(model.state_dict())
    src, src_mask, _, tgt_in = pair_batch()
    torch.testing.assert_close(model(src, tgt_in, src_mask), reference.eval()(src, tgt_in, src_mask))


def test_the_output_bias_is_added_to_every_path_s_logits_and_saved_only_where_on():
    """`output_bias`: teacher-forced logits, each decoding step and forced scoring all add it; a model without
    one has no key for it (checkpoints written before it load as they are)."""
    torch.manual_seed(0)
    model = build_transformer(tiny_config(output_bias=True)).eval()
    plain = build_transformer(tiny_config()).eval()
    assert "output_bias" not in plain.state_dict() and plain.output_bias is None
    missing = plain.load_state_dict(
        {k: v for k, v in model.state_dict().items() if k != "output_bias"}, strict=False
    )
    assert missing.missing_keys == [] and missing.unexpected_keys == []
    with torch.no_grad():
        model.output_bias.normal_()
    assert model.state_dict()["output_bias"].shape == (model.vocab_size,)
    src, src_mask, _, tgt_in = pair_batch()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt_in, memory, src_mask)
        torch.testing.assert_close(full, plain.decode(tgt_in, memory, src_mask) + model.output_bias)
        state = model.start_decoding(memory, src_mask)
        for i in range(tgt_in.shape[1]):
            torch.testing.assert_close(
                model.decode_step(tgt_in[:, i], state), full[:, i], atol=1e-5, rtol=1e-5
            )
        tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), 3)], 1)
        scored, _ = ModelDecoder(model).forced(src, src_mask, tgt_in, tgt_out)
        expected = torch.log_softmax(full, -1).gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(scored, expected, atol=1e-5, rtol=1e-5)


def test_a_pre_norm_model_with_fairseq_positions_computes_m2m100_s_logits():
    """M2M-100 (NLLB-200's architecture) is a pre-norm stack with a final LayerNorm after each of encoder
    and decoder (`encoder.layer_norm`, `decoder.layer_norm`): attnx's `encoder_norm` and `decoder_norm`, with
    `fairseq_sinusoidal` positions and embeddings × √d_model, on the same weights, fp32."""
    transformers = pytest.importorskip("transformers")
    from attnx.export.huggingface import _copy_attention, _copy_ffn, _copy_norm
    from attnx.model import TransformerConfig

    torch.manual_seed(0)
    vocab, d, pad = 40, 32, 1
    config = TransformerConfig.from_dict(
        dict(vocab_size=vocab, d_model=d, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)
        | dict(max_len=64, pad_id=pad, norm_position="pre", norm={"name": "layernorm", "args": {"eps": 1e-5}})
        | dict(positional={"name": "fairseq_sinusoidal", "args": {"padding_idx": pad}})
    )
    model = build_transformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf_config = transformers.M2M100Config(
        vocab_size=vocab,
        d_model=d,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=pad,
        tie_word_embeddings=True,
    )
    hf = transformers.M2M100ForConditionalGeneration(hf_config).eval()
    same = torch.arange(d)  # no permutation of the residual stream
    with torch.no_grad():
        m2m = hf.model
        for embedding in (m2m.shared, m2m.encoder.embed_tokens, m2m.decoder.embed_tokens, hf.lm_head):
            embedding.weight.copy_(model.output_weight)
        for dst, src in zip(m2m.encoder.layers, model.encoder_layers, strict=True):
            _copy_attention(dst.self_attn, src.self_attn, same)
            _copy_norm(dst.self_attn_layer_norm, src.attn_residual.norm, same)
            _copy_ffn(dst, src.ffn, same)
            _copy_norm(dst.final_layer_norm, src.ffn_residual.norm, same)
        for dst, src in zip(m2m.decoder.layers, model.decoder_layers, strict=True):
            _copy_attention(dst.self_attn, src.self_attn, same)
            _copy_norm(dst.self_attn_layer_norm, src.self_residual.norm, same)
            _copy_attention(dst.encoder_attn, src.cross_attn, same)
            _copy_norm(dst.encoder_attn_layer_norm, src.cross_residual.norm, same)
            _copy_ffn(dst, src.ffn, same)
            _copy_norm(dst.final_layer_norm, src.ffn_residual.norm, same)
        _copy_norm(m2m.encoder.layer_norm, model.encoder_norm, same)
        _copy_norm(m2m.decoder.layer_norm, model.decoder_norm, same)
        src = torch.randint(3, vocab, (2, 9))
        src[1, 6:] = pad  # right padding: M2M-100 numbers the real tokens from padding_idx + 1 as attnx does
        src_mask, tgt_in = src != pad, torch.randint(3, vocab, (2, 7))
        theirs = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt_in).logits
        memory = model.encode(src, src_mask)
        encoded = m2m.encoder(input_ids=src, attention_mask=src_mask.long()).last_hidden_state
        full = model.decode(tgt_in, memory, src_mask)
        state = model.start_decoding(memory, src_mask)
        steps = torch.stack([model.decode_step(tgt_in[:, i], state) for i in range(7)], 1)
    diffs = [float((encoded - memory)[src_mask].abs().max()), float((theirs - full).abs().max())]
    diffs.append(float((theirs - steps).abs().max()))
    encoder, logits, step = diffs
    print(f"M2M-100 max |Δ|: encoder {encoder:.1e}, logits {logits:.1e}, decode_step {step:.1e}")
    assert max(diffs) <= 1e-5 and max(diffs[:2]) <= 1e-6
