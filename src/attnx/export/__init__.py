"""Export a trained checkpoint to other inference engines: CTranslate2 and Hugging Face Marian.

Each exporter needs an optional extra (`pip install 'attnx[ct2]'` / `'attnx[hf]'`), imported only when
it runs: importing this package needs neither.
"""

from __future__ import annotations

from attnx.export.common import ExportError
from attnx.export.ctranslate2 import CTranslate2Translator, export_ctranslate2, is_ctranslate2_model
from attnx.export.huggingface import export_huggingface

__all__ = [
    "CTranslate2Translator",
    "ExportError",
    "export_ctranslate2",
    "export_huggingface",
    "is_ctranslate2_model",
]
