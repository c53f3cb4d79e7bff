"""Output formats written from [`Hypothesis`][attnx.inference.hypothesis.Hypothesis] lists, once for every
command (`attnx translate --format`, the server's JSON answers).

Each input gives a list of hypotheses, best first (empty for a blank input line).

- `text`: the best hypothesis's text, one line per input (blank for blank); with alignments, Marian's
  plain form `text ||| 0-0 1-2 ...` (a blank input line still gives a blank line). With an n-best list
  (`--search.nbest N`, N > 1), Marian's short n-best form instead, one line per hypothesis best first:
  `id ||| text [||| 0-0 1-2 ...] ||| score`, where `id` is the 0-based input line.
- `jsonl`: one JSON object per input line, `{"hypotheses": [{"text", "score", "log_prob", "tokens", ...}]}`,
  best first. `score` is what the search ranked by (`log_prob / lp(|Y|)`), `log_prob` the total
  log-probability in nats (`</s>` included), `tokens` the number of target SentencePiece pieces (`</s>` not
  counted). With token scores, `pieces` (the target pieces and `</s>`) and `token_log_probs` (one per
  piece); with alignments, `alignment` as `[source piece, target piece]` pairs; with MBR decoding
  (`--search.mbr N`), `expected_utility` (0-100), the hypotheses being the distinct candidates ranked by it;
  with terminology constraints, `unmet`: the phrases to include (0-based) the maximum length left out (a
  blank input line: all of them).
- `moses`: the n-best form of Moses and Marian, one line per hypothesis,
  `id ||| text [||| 0-0 1-2 ...] [||| WordScores= ...] ||| F0= log_prob [MBR= expected utility] ||| score`,
  where `id` is the 0-based input line.

A blank input line gives one empty hypothesis (text `""`, scores 0, no tokens), so every format keeps one
entry per input line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from attnx.errors import ConfigError

if TYPE_CHECKING:
    from attnx.inference.hypothesis import Hypothesis

OutputFormat = Literal["text", "jsonl", "moses"]
FORMATS: tuple[OutputFormat, ...] = ("text", "jsonl", "moses")


def alignment_text(pairs: Sequence[tuple[int, int]]) -> str:
    """Pharaoh form, `0-0 1-2 ...` (source piece - target piece, 0-based)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def hypothesis_fields(
    hypothesis: Hypothesis,
    *,
    token_scores: bool = False,
    pieces: Callable[[Sequence[int]], list[str]] | None = None,
) -> dict[str, Any]:
    """The JSON object of one hypothesis (module docstring); `pieces` names ids for the token scores."""
    fields: dict[str, Any] = {
        "text": hypothesis.text,
        "score": hypothesis.score,
        "log_prob": hypothesis.log_prob,
        "tokens": len(hypothesis.tokens),
    }
    if token_scores and hypothesis.token_log_probs is not None:
        if pieces is not None:
            fields["pieces"] = [*pieces(hypothesis.tokens), "</s>"]
        fields["token_log_probs"] = list(hypothesis.token_log_probs)
    if hypothesis.alignment is not None:
        fields["alignment"] = [list(pair) for pair in hypothesis.alignment]
    if hypothesis.expected_utility is not None:
        fields["expected_utility"] = hypothesis.expected_utility
    if hypothesis.unmet:
        fields["unmet"] = list(hypothesis.unmet)
    return fields


def text_line(hypotheses: Sequence[Hypothesis]) -> str:
    """The best text (blank for none), with ` ||| ` and its alignment when it has one."""
    if not hypotheses:
        return ""
    best = hypotheses[0]
    if best.alignment is None or not (best.text or best.alignment):  # a blank line stays blank
        return best.text
    return f"{best.text} ||| {alignment_text(best.alignment)}"


def nbest_text_lines(index: int, hypotheses: Sequence[Hypothesis]) -> list[str]:
    """Marian's short n-best lines of input `index` (0-based): `id ||| text [||| alignment] ||| score`."""
    lines = []
    for h in hypotheses:
        fields = [str(index), h.text]
        if h.alignment is not None:
            fields.append(alignment_text(h.alignment))
        lines.append(" ||| ".join([*fields, repr(h.score)]))
    return lines


def jsonl_line(
    hypotheses: Sequence[Hypothesis],
    *,
    token_scores: bool = False,
    pieces: Callable[[Sequence[int]], list[str]] | None = None,
) -> str:
    hyps = [hypothesis_fields(h, token_scores=token_scores, pieces=pieces) for h in hypotheses]
    return json.dumps({"hypotheses": hyps}, ensure_ascii=False)


def moses_lines(index: int, hypotheses: Sequence[Hypothesis], *, token_scores: bool = False) -> list[str]:
    """Moses/Marian n-best lines of input `index` (0-based)."""
    lines = []
    for h in hypotheses:
        fields = [str(index), h.text]
        if h.alignment is not None:
            fields.append(alignment_text(h.alignment))
        if token_scores and h.token_log_probs is not None:
            fields.append("WordScores= " + " ".join(repr(x) for x in h.token_log_probs))
        features = f"F0= {h.log_prob!r}"
        if h.expected_utility is not None:
            features += f" MBR= {h.expected_utility!r}"
        fields += [features, repr(h.score)]
        lines.append(" ||| ".join(fields))
    return lines


def render(
    format: OutputFormat,
    results: Sequence[Sequence[Hypothesis]],
    *,
    first: int = 0,
    token_scores: bool = False,
    pieces: Callable[[Sequence[int]], list[str]] | None = None,
    nbest: bool = False,
) -> str:
    """The output of consecutive inputs `first`, `first + 1`, ... in `format`, each line ending in `\\n`;
    `nbest`: the search returns an n-best list (`text` then writes one line per hypothesis)."""
    if format == "text" and nbest:
        lines = [line for i, hyps in enumerate(results) for line in nbest_text_lines(first + i, hyps)]
    elif format == "text":
        lines = [text_line(hyps) for hyps in results]
    elif format == "jsonl":
        lines = [jsonl_line(hyps, token_scores=token_scores, pieces=pieces) for hyps in results]
    elif format == "moses":
        lines = [
            line
            for i, hyps in enumerate(results)
            for line in moses_lines(first + i, hyps, token_scores=token_scores)
        ]
    else:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    return "".join(line + "\n" for line in lines)
