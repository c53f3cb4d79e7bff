"""The decoding probe times the model's own beam-search steps, in fp32 and in bf16, and leaves the model as it was."""

from __future__ import annotations

import math

import torch

from attnx.inference import step_probe
from attnx.inference.decoder import ModelDecoder
from attnx.inference.step_probe import PROBE_STEPS, bf16_decoding_speedup, model_signature
from attnx.model import build_transformer
from tests.conftest import tiny_config


def test_the_probe_runs_the_models_steps_in_both_precisions_and_restores_its_mode(monkeypatch) -> None:
    model = build_transformer(tiny_config()).train()
    decoder = ModelDecoder(model)
    seen: list[tuple[torch.dtype | None, int]] = []
    step = decoder.step

    def recorded(tokens, state):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen.append((dtype, tokens.numel()))
        return step(tokens, state)

    monkeypatch.setattr(decoder, "step", recorded)
    ratio = bf16_decoding_speedup(decoder, torch.device("cpu"), seconds=0.0)
    assert math.isfinite(ratio) and ratio > 0
    rows = step_probe.PROBE_SENTENCES * step_probe.PROBE_BEAM
    assert {dtype for dtype, _ in seen} == {None, torch.bfloat16}
    assert all(n == rows for _, n in seen)
    assert len(seen) >= 3 * 2 * PROBE_STEPS  # a warm-up and at least two timed runs of each precision
    assert model.training  # decoding() put it in eval mode for the probe only


def test_models_of_one_shape_share_a_signature_and_others_do_not() -> None:
    one, twin = build_transformer(tiny_config()), build_transformer(tiny_config())
    other = build_transformer(tiny_config(d_ff=48))
    assert model_signature(ModelDecoder(one)) == model_signature(ModelDecoder(twin))
    assert model_signature(ModelDecoder(one)) != model_signature(ModelDecoder(other))
    assert model_signature(ModelDecoder(one)) != model_signature(ModelDecoder(one.bfloat16()))
