"""`auto`: what a checkpoint decodes in, chosen once per process and model from a probe of the model (injected here),
and bf16 decoding of a trained model held against fp32's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnx.errors import ConfigError
from attnx.evaluation.agreement import agreement
from attnx.inference.decoder import ModelDecoder
from attnx.inference.eager import EagerTranslator
from attnx.inference.precision import (
    BF16,
    FP32,
    MIN_DECODE_BF16_SPEEDUP,
    PrecisionChoice,
    auto_precision,
    bf16_matmul_speedup,
    choose_bf16,
    cpu_model,
    decoding_probe,
    probe_device,
    resolve_precision,
)
from attnx.model import Transformer, build_transformer
from tests.conftest import tiny_config

ZEN4 = {"avx512f", "avx512_bf16", "avx2"}


def never_probed() -> float:
    raise AssertionError("the probe ran")


def test_amx_decodes_in_bf16_and_avx2_in_fp32_without_probing() -> None:
    assert choose_bf16({"amx_bf16", "amx_tile"}, never_probed, 1.5).precision == BF16
    assert choose_bf16({"avx2"}, never_probed, 1.5) == PrecisionChoice(FP32, "CPU has no bf16 units")


@pytest.mark.parametrize(("ratio", "expected"), [(3.1, BF16), (MIN_DECODE_BF16_SPEEDUP, BF16), (1.1, FP32)])
def test_avx512_bf16_alone_follows_the_probe(ratio: float, expected: str) -> None:
    choice = choose_bf16(ZEN4, lambda: ratio, MIN_DECODE_BF16_SPEEDUP, "this model's beam-search steps")
    assert choice.precision == expected
    assert f"this model's beam-search steps measured {'only ' * (expected == FP32)}{ratio:.1f}x" in (
        choice.reason
    )


def tiny_model(d_model: int = 16) -> Transformer:
    return build_transformer(tiny_config(d_model=d_model))


def test_auto_is_probed_once_per_device_and_model_shape_and_said_once(capsys) -> None:
    asked: list[tuple[torch.device, int]] = []

    def probe(device: torch.device, decoder) -> PrecisionChoice:
        asked.append((device, decoder.models[0].d_model))
        return PrecisionChoice(BF16, "this model's beam-search steps measured 1.6x fp32")

    model, twin, other = tiny_model(), tiny_model(), tiny_model(d_model=8)
    with decoding_probe(probe):
        assert [resolve_precision("auto", model), resolve_precision(None, twin)] == [BF16, BF16]
        assert auto_precision(ModelDecoder(model)).precision == BF16
        assert resolve_precision("auto", other) == BF16  # another shape is measured anew
    assert asked == [(torch.device("cpu"), 16), (torch.device("cpu"), 8)]
    assert (
        capsys.readouterr().err.splitlines()
        == [
            "decoding in bf16-mixed: this model's beam-search steps measured 1.6x fp32 (--precision 32-true to "
            "override)"
        ]
        * 2
    )


def test_a_precision_given_is_kept_checked_and_not_probed(capsys) -> None:
    model = tiny_model()
    with decoding_probe(lambda device, decoder: pytest.fail("probed")):
        assert resolve_precision("32-true", model) == FP32
        assert resolve_precision("bf16-mixed", model) == BF16
        with pytest.raises(ConfigError, match="16-mixed decodes on CUDA devices"):
            resolve_precision("16-mixed", model)
        with pytest.raises(ConfigError, match="choose one of auto, 32-true, bf16-mixed, 16-mixed"):
            resolve_precision("bf16", model)
    assert capsys.readouterr().err == ""


def test_the_probe_of_this_machine_times_the_model_and_gives_a_reason() -> None:
    """What it chooses depends on the CPU; that it answers, with a reason, does not."""
    choice = probe_device(torch.device("cpu"), ModelDecoder(tiny_model()))
    assert choice.precision in (FP32, BF16) and choice.reason
    assert cpu_model()
    ratio = bf16_matmul_speedup(seconds=0.01, shape=(8, 16, 32))
    assert math.isfinite(ratio) and ratio > 0


def test_a_cuda_device_without_bf16_decodes_in_fp32(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    choice = probe_device(torch.device("cuda"), ModelDecoder(tiny_model()))
    assert choice == PrecisionChoice(FP32, "Tesla T4 has no bf16 units")


MAX_BLEU_DIFFERENCE = 2.0
MAX_CHRF_DIFFERENCE = 2.0
MIN_IDENTICAL = 0.6


def test_bf16_decoding_of_a_trained_model_holds_against_fp32(trained: Path, test_set, trained_corpus) -> None:
    """The trained fixture's 200 test sentences, beam 4, in bf16-mixed and in 32-true: corpus BLEU and chrF
    within 2 points of each other and at least 60% of the lines identical. bf16 moves a line only where two
    hypotheses' scores were within its rounding (the search's scores stay float32), so most lines agree."""
    references = trained_corpus.references("test")
    fp32 = EagerTranslator.from_checkpoint(trained, precision="32-true").translate(test_set.lines)
    bf16 = EagerTranslator.from_checkpoint(trained, precision="bf16-mixed").translate(test_set.lines)
    result = agreement(BF16, bf16, fp32, references)
    assert abs(result.bleu - result.fp32_bleu) <= MAX_BLEU_DIFFERENCE, result.line()
    assert abs(result.chrf - result.fp32_chrf) <= MAX_CHRF_DIFFERENCE, result.line()
    assert result.identical >= MIN_IDENTICAL, result.line()


def test_three_translations_on_one_machine_decode_alike_beside_a_busy_process(
    trained: Path, test_set, monkeypatch, capsys
) -> None:
    """The decoding probe's readings wander (1.6x, 0.8x, 1.7x); the first is kept, so three commands (each a
    new process's choice; the second beside a process that keeps a core busy) decode in the same precision and
    give the same translations."""
    import subprocess
    import sys

    import attnx.inference.precision as precision

    readings = iter([1.6, 0.8, 1.7])
    taken: list[float] = []
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(ZEN4))
    monkeypatch.setattr(
        precision, "bf16_decoding_speedup", lambda decoder, device: taken.append(next(readings)) or taken[-1]
    )
    outputs, lines = [], []
    for i in range(3):
        monkeypatch.setenv("ATTNX_INHERITED_CHOICES", "{}")  # each command a new process
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if i == 1 else None
        try:
            with decoding_probe(probe_device):  # the machine's own choice, nothing cached from before
                translator = EagerTranslator.from_checkpoint(trained, precision="auto")
                outputs.append(translator.translate(test_set.lines[:20]))
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()
        err = capsys.readouterr().err
        assert err, (i, taken)
        lines.append(err.splitlines()[0])
    assert taken == [1.6] and translator.precision == BF16
    assert outputs[0] == outputs[1] == outputs[2]
    assert lines[0].startswith(
        "decoding in bf16-mixed: CPU has AVX512-BF16; this model's beam-search steps measured 1.6x"
    )
    assert "kept in" in lines[1] and lines[1] == lines[2]


def test_a_decoding_probe_beside_busy_processes_decodes_in_fp32_and_keeps_nothing(monkeypatch) -> None:
    import attnx.choices as choices
    import attnx.inference.precision as precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(ZEN4))
    monkeypatch.setattr(precision, "bf16_decoding_speedup", lambda decoder, device: 2.5)
    monkeypatch.setattr(choices, "busy_cores", lambda measure: (measure(), 1.1))
    choice = probe_device(torch.device("cpu"), ModelDecoder(tiny_model()))
    assert choice.precision == FP32 and "1.1 cores busy" in choice.reason and "not trusted" in choice.reason
