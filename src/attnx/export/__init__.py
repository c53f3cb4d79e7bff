"""Export a trained checkpoint to other inference engines: CTranslate2 and Hugging Face Marian.

Each exporter needs an optional extra (`pip install 'attnx[ct2]'` / `'attnx[hf]'`), imported only when
it runs: importing this package needs neither. Exporters only write; the engines that decode what they
write live in `attnx.inference` ([`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator]).
"""

from __future__ import annotations

from attnx.export.common import ExportError
from attnx.export.ctranslate2 import export_ctranslate2
from attnx.export.huggingface import export_huggingface

__all__ = ["ExportError", "export_ctranslate2", "export_huggingface"]
