"""What a SentencePiece model file records: the parts that decide how text is cut into pieces, and the parts that
only say where and how it was trained.

A `.model` file is a serialized `ModelProto`: the pieces (text, score, type), the normalizer and denormalizer
specs, and the `trainer_spec` of the run that trained it. The trainer records its input files and `model_prefix`
as it was given them (absolute paths of a scratch folder) and the threads it ran on: the same training on
another machine or into another folder would give other bytes for the same model.
[`stable_proto`][attnx.data.sentencepiece_proto.stable_proto] keeps only names there, so the same `attnx prepare`
writes the same file everywhere; [`segmentation_digest`][attnx.data.sentencepiece_proto.segmentation_digest] is
the identity of a model as a tokenizer, which two files equal in all that decides segmentation share whatever
else they record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sentencepiece import sentencepiece_model_pb2

SEGMENTATION_FIELDS = (
    "model_type",
    "byte_fallback",
    "treat_whitespace_as_suffix",
    "allow_whitespace_only_pieces",
    "split_by_whitespace",
    "unk_id",
    "bos_id",
    "eos_id",
    "pad_id",
    "unk_piece",
    "bos_piece",
    "eos_piece",
    "pad_piece",
    "unk_surface",
)
"""The `trainer_spec` fields SentencePiece reads when it encodes or decodes (the special ids are found through
their pieces, byte fallback and whitespace handling change the cut, `unk_surface` is what decoding writes for
an unknown piece); every other field only shaped the training."""

PIECE_TYPE = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
"""The kinds of piece (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE, UNUSED), by number."""

PROVENANCE_FIELDS = ("num_threads",)
"""`trainer_spec` fields of the machine a model was trained on, cleared from what attnx writes: the same training
on more threads gives the same pieces."""


def parse(proto: bytes) -> Any:
    """The `ModelProto` serialized in `proto` (the bytes of a `.model` file)."""
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    return model


def stable_proto(
    proto: bytes, inputs: Sequence[str | Path] = (), model_prefix: str | Path | None = None
) -> bytes:
    """`proto` with the file names of `inputs` and `model_prefix` recorded in place of their paths, and the
    [`PROVENANCE_FIELDS`][attnx.data.sentencepiece_proto.PROVENANCE_FIELDS] cleared: the same training gives
    the same bytes in any folder, on any machine. Pieces, scores, normalization and every setting of the
    training stay as they were."""
    model = parse(proto)
    spec = model.trainer_spec
    del spec.input[:]
    spec.input.extend(Path(p).name for p in inputs)
    if model_prefix:
        spec.model_prefix = Path(model_prefix).name
    else:
        spec.ClearField("model_prefix")
    for field in PROVENANCE_FIELDS:
        spec.ClearField(field)
    return model.SerializeToString(deterministic=True)


def _fields(message: Any, names: Sequence[str]) -> list[tuple[str, Any]]:
    """(name, value) of each field, unset ones at their default: a field written out at its default value and one
    left out mean the same."""
    return [(name, getattr(message, name)) for name in names]


def segmentation_parts(proto: bytes) -> dict[str, Any]:
    """What decides how a model cuts and joins text, by part: `pieces` (text, score, type of each),
    `normalizer` and `denormalizer` (every field of each spec, the normalization rules included), `trainer`
    (the [`SEGMENTATION_FIELDS`][attnx.data.sentencepiece_proto.SEGMENTATION_FIELDS])."""
    model = parse(proto)
    spec_fields = [f.name for f in sentencepiece_model_pb2.NormalizerSpec.DESCRIPTOR.fields]
    return {
        "pieces": [(p.piece, p.score, p.type) for p in model.pieces],
        "normalizer": _fields(model.normalizer_spec, spec_fields),
        "denormalizer": _fields(model.denormalizer_spec, spec_fields),
        "trainer": _fields(model.trainer_spec, SEGMENTATION_FIELDS),
    }


def segmentation_digest(proto: bytes) -> str:
    """SHA-256 of [`segmentation_parts`][attnx.data.sentencepiece_proto.segmentation_parts]: equal for two models
    that cut every text into the same ids and decode them alike, whatever their training recorded."""
    return hashlib.sha256(repr(sorted(segmentation_parts(proto).items())).encode()).hexdigest()


def segmentation_difference(a: bytes, b: bytes) -> str:
    """How two models differ in what decides segmentation, in a few words (e.g. `4000 vs 8000 pieces`,
    `piece 17 text: '▁the' vs '▁a'`, `piece 5 type: 'NORMAL' vs 'USER_DEFINED'`, `normalizer add_dummy_prefix: True
    vs False`); empty when they do not."""
    left, right = segmentation_parts(a), segmentation_parts(b)
    pieces_a, pieces_b = left.pop("pieces"), right.pop("pieces")
    if len(pieces_a) != len(pieces_b):
        return f"{len(pieces_a)} vs {len(pieces_b)} pieces"
    for i, (x, y) in enumerate(zip(pieces_a, pieces_b, strict=True)):
        if x != y:
            k = next(k for k in range(3) if x[k] != y[k])
            shown = [x[k], y[k]] if k < 2 else [PIECE_TYPE.Name(x[k]), PIECE_TYPE.Name(y[k])]
            return f"piece {i} {('text', 'score', 'type')[k]}: {shown[0]!r} vs {shown[1]!r}"
    for part, fields in left.items():
        for (name, x), (_, y) in zip(fields, right[part], strict=True):
            if x != y:
                if isinstance(x, bytes):  # the compiled normalization rules
                    return f"{part} {name} differs"
                return f"{part} {name}: {x!r} vs {y!r}"
    return ""
