"""``attnx export``: a trained checkpoint as a CTranslate2 model or a Hugging Face Marian model."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from attnx.inference.config import SearchConfig

Quantization = Literal[
    "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16"
]


def export(
    ckpt_path: Path,
    format: Literal["ctranslate2", "huggingface"],
    output: Path,
    quantization: Quantization | None = None,
    search: SearchConfig | None = None,
    force: bool = False,
) -> int:
    """Write a trained checkpoint as a CTranslate2 model (fast CPU/GPU inference, int8) or a Marian model.

    ctranslate2 (pip install "attnx[ct2]"): a directory that attnx translate --model, attnx serve and
    attnx.load read, and that ctranslate2.Translator loads with its sentencepiece.model. huggingface (pip
    install "attnx[hf]"): a MarianMTModel directory for transformers' from_pretrained. Components the engine
    cannot represent (a plugin's attention, pre-norm or learned positions for Marian) are refused by name.
    Example: attnx export --ckpt_path averaged.ckpt --format ctranslate2 --output model-ct2 --quantization int8

    Args:
        ckpt_path: Checkpoint written by attnx fit or attnx average.
        format: ctranslate2 or huggingface.
        output: Directory to create (it must not exist, or be empty, unless --force).
        quantization: ctranslate2 only: weight type; none keeps float32 as trained.
        search: ctranslate2 only: default search stored with the model (CTranslate2 has only the |Y|^α length
            penalty, so the default is beam 4, α 0.6 with length_penalty fairseq).
        force: Replace an existing output directory.
    """
    from attnx.export.common import ExportError

    if format == "huggingface":
        if quantization is not None or search is not None:
            raise ExportError("--quantization and --search apply to --format ctranslate2 only")
        from attnx.export.huggingface import export_huggingface

        written = export_huggingface(ckpt_path, output, force=force)
        print(f"wrote a Marian model to {written}: MarianMTModel.from_pretrained({str(written)!r})")
        return 0
    from attnx.export.ctranslate2 import export_ctranslate2

    written = export_ctranslate2(ckpt_path, output, quantization=quantization, search=search, force=force)
    print(
        f"wrote a CTranslate2 model ({quantization or 'float32'}) to {written}: attnx translate --model {written}"
    )
    return 0
