"""How to decode, as plain settings (no torch): the schema of `search` in commands and configs.

Every setting is checked here, once, when a [`SearchConfig`][attnx.inference.config.SearchConfig] is made
(also by `dataclasses.replace`): a bad value is a `ValueError` of one line naming the option.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from attnx.errors import ConfigError

LengthPenalty = Literal["gnmt", "fairseq"]
MBRUtility = Literal["chrf", "bleu"]
MBRCandidates = Literal["sample", "epsilon", "nbest"]

Precision = Literal["auto", "32-true", "bf16-mixed", "16-mixed"]
"""What a checkpoint decodes in (`attnx translate --precision`), named as `attnx fit`'s `--trainer.precision`;
`auto` is chosen from the device ([`attnx.inference.precision`][attnx.inference.precision])."""

PRECISIONS: tuple[str, ...] = get_args(Precision)
"""The values of [`Precision`][attnx.inference.config.Precision], in the order usage errors list them."""

AUTO = "auto"
"""The precision every decoding entry point defaults to: bf16-mixed where the device's bf16 units make decoding
faster, else 32-true, chosen once per process and said on standard error."""


OptionName = Callable[[str], str]
"""How a message names a search setting (`beam`) for whoever can change it: the command line's option
([`command_line_option`][attnx.inference.config.command_line_option]) or a server's request field."""


def command_line_option(setting: str) -> str:
    """`--search.beam`: a search setting as `attnx translate` and every other command take it."""
    return f"--search.{setting}"


class SearchSettingError(ConfigError):
    """A search refused, with the setting to change that would make it work, named for whoever can change it:
    `str(err)` names the command line's option (`raise --search.beam to at least 5`), `err.worded(name)` another
    interface's (`name`: an [`OptionName`][attnx.inference.config.OptionName]; a server names its request's
    field)."""

    def __init__(self, before: str, setting: str, after: str) -> None:
        self.before, self.setting, self.after = before, setting, after
        super().__init__(self.worded(command_line_option))

    def worded(self, name: OptionName) -> str:
        return f"{self.before}{name(self.setting)}{self.after}"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.before, self.setting, self.after)


_OPTION = re.compile(r"--search\.([a-z_]+)")


def worded(err: BaseException, name: OptionName) -> str:
    """The message of `err` with the search settings it asks to change named by `name`: a
    [`SearchSettingError`][attnx.inference.config.SearchSettingError]'s setting, and every `--search.X` of any
    other message."""
    if isinstance(err, SearchSettingError):
        return err.worded(name)
    return _OPTION.sub(lambda match: name(match.group(1)), str(err))


def check_precision(precision: str, device_type: str) -> None:
    """A usage error for a precision that is not one of [`PRECISIONS`][attnx.inference.config.PRECISIONS] or
    that a `device_type` (`cpu`, `cuda`) cannot decode in."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "16-mixed" and device_type != "cuda":
        raise ConfigError("precision 16-mixed decodes on CUDA devices; on a CPU choose bf16-mixed or 32-true")


DEFAULT_MAX_TOKENS = 4096
"""Source tokens per decoding batch, padding included: every engine's, `attnx translate`'s and `attnx serve`'s default."""


DEFAULT_BEAM = 4
"""§6.1's beam size, `SearchConfig.beam`'s default; a sampling search leaves it there (it is not used)."""
ALPHA_RANGE = (-5.0, 5.0)
"""Length penalty exponents accepted: `lp` stays a finite float32 for outputs of up to millions of tokens
(`|Y| ** 5`); the paper's α is 0.6, fairseq's `--lenpen` is usually 0 to 2."""
TEMPERATURE_RANGE = (1e-3, 1e3)
"""Sampling temperatures accepted: dividing float32 log-probabilities by them keeps the most probable token
finite and `-inf` (a forbidden token) `-inf`. Below 0.001 use `top_k` 1 (greedy); above 1000 the draw is all but
uniform over the tokens allowed."""
SEED_RANGE = (0, 2**64 - 1)
"""Seeds torch's random generator takes (`torch.Generator.manual_seed`: 64 bits)."""

KINDS = {"int": "an integer", "int | None": "an integer or null", "float": "a number", "bool": "a boolean"}
"""What each field annotation of `SearchConfig` accepts, as messages name it (the literals are checked by
value)."""


def kind_of(value: object) -> str:
    """The kind of `value`, as messages name it (`accepts` takes an integer for a number; a boolean is neither)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Integral):
        return "an integer"
    if isinstance(value, numbers.Real):
        return "a number"
    names = {type(None): "null", str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def accepts(kind: str, value: object) -> bool:
    """Whether `value` is of `kind`, one of `KINDS`' values."""
    got = kind_of(value)
    return {
        "an integer": got == "an integer",
        "an integer or null": got in ("an integer", "null"),
        "a number": got in ("an integer", "a number"),
        "a boolean": got == "a boolean",
    }[kind]


def within(value: float, bounds: tuple[float, float]) -> bool:
    """`bounds[0] <= value <= bounds[1]`, never for NaN."""
    return bounds[0] <= value <= bounds[1]


@dataclass
class SearchConfig:
    """How to decode (§6.1 defaults: beam 4, α = 0.6, maximum length input + 50).

    Beam search by default; `sampling=True` draws `nbest` samples per input instead (fairseq's `--beam` with
    `--sampling`; `beam` is then not used and must stay at its default); `mbr=N` draws `N` candidates and ranks them by expected utility (MBR decoding). All report, per hypothesis, `score` (what the search ranks by: `log_prob / lp(|Y|)`) and
    `log_prob` (the total log-probability in nats, `</s>` included); docs/decoding.md.
    """

    beam: int = DEFAULT_BEAM
    """Beam size; 1 = greedy search. Not used with sampling (search.nbest is the number of samples)."""
    alpha: float = 0.6
    """Length penalty exponent α, from -5 to 5."""
    length_penalty: LengthPenalty = "gnmt"
    """`gnmt`: `((5 + |Y|) / 6) ** α` (the paper's, §6.1); `fairseq`: `|Y| ** α`."""
    max_len_a: float = 1.0
    """Maximum output length = `max_len_a * input length + max_len_b` (paper: input length + 50); a finite
    `max_len_a` >= 0."""
    max_len_b: int = 50
    """See `max_len_a`."""
    max_positions: int | None = None
    """Target positions the model accepts (its `max_len`); caps the maximum output length. None: no cap."""
    nbest: int = 1
    """Hypotheses returned per input, best first: at most `beam` with beam search; with sampling, the
    number of samples drawn per input."""
    sampling: bool = False
    """Sample each next token from the model's distribution (ancestral sampling, shaped by `temperature`,
    `top_k` and `top_p`) instead of searching a beam."""
    top_k: int = 0
    """Sampling only: draw from the `top_k` most probable tokens (0: all; 1: greedy)."""
    top_p: float = 1.0
    """Sampling only: draw from the smallest set of most probable tokens whose probability reaches `top_p`
    (nucleus sampling), in (0, 1]; 1: all."""
    temperature: float = 1.0
    """Sampling only: divide the log-probabilities by this (0.001 to 1000) before drawing; below 1 sharpens,
    above 1 flattens. Reported scores stay the model's own."""
    epsilon: float = 0.0
    """Sampling only: never draw a token whose probability (after `temperature`) is below `epsilon` (epsilon
    sampling, Hewitt et al. 2022; the most probable token always stays), in [0, 1); 0: off."""
    seed: int | None = None
    """Sampling only: seed of the random draws, 0 to 2**64 - 1 (torch's generator; an export decoded by
    CTranslate2: to 2**32 - 1); the same seed gives the same samples on CPU. None: a fresh draw each run."""
    mbr: int = 0
    """MBR decoding: draw this many candidates (see `mbr_candidates`) and return them ranked by expected
    utility against each other, best first (each with its `expected_utility`); 0: off. The table of their
    pairwise utilities must fit the memory available (checked when a translator is made)."""
    mbr_utility: MBRUtility = "chrf"
    """MBR only: the utility, sacreBLEU's sentence `chrf` or sentence `bleu`."""
    mbr_candidates: MBRCandidates = "sample"
    """MBR only: `sample` (ancestral sampling with `temperature`, `top_k`, `top_p`), `epsilon` (sampling with
    `epsilon` > 0, e.g. 0.02) or `nbest` (the n-best list of a beam of at least `mbr`)."""
    no_repeat_ngram: int = 0
    """Never produce an n-gram of this many target pieces twice in one hypothesis (0: off)."""
    min_length: int = 0
    """`</s>` is not allowed before this many target pieces (a forced prefix counts; the maximum length
    still wins)."""
    alignment: bool = False
    """Also return hard alignments (source piece, target piece) from the encoder-decoder attention."""

    def __post_init__(self) -> None:
        for field in fields(self):
            kind = KINDS.get(str(field.type))
            value = getattr(self, field.name)
            if kind is not None and not accepts(kind, value):
                raise ConfigError(f"search.{field.name} must be {kind}, got {value!r} ({kind_of(value)})")
        checks = [
            (self.beam >= 1, f"search.beam must be at least 1, got {self.beam}"),
            (self.nbest >= 1, f"search.nbest must be at least 1, got {self.nbest}"),
            (
                self.sampling or self.nbest <= self.beam,
                SearchSettingError(
                    f"search.nbest ({self.nbest}) cannot exceed search.beam ({self.beam}): a beam keeps only "
                    "beam hypotheses; raise ",
                    "beam",
                    f" to at least {self.nbest}",
                ),
            ),
            (
                self.length_penalty in ("gnmt", "fairseq"),
                f"search.length_penalty must be 'gnmt' or 'fairseq', got {self.length_penalty!r}",
            ),
            (
                within(self.alpha, ALPHA_RANGE),
                f"search.alpha must be from {ALPHA_RANGE[0]:g} to {ALPHA_RANGE[1]:g}, got {self.alpha}",
            ),
            (
                0 <= self.max_len_a < math.inf,
                f"search.max_len_a must be a finite number >= 0, got {self.max_len_a}",
            ),
            (
                self.max_positions is None or self.max_positions >= 1,
                f"search.max_positions must be at least 1 (or null: no cap), got {self.max_positions}",
            ),
            (self.top_k >= 0, f"search.top_k must be >= 0 (0: all tokens), got {self.top_k}"),
            (0 < self.top_p <= 1, f"search.top_p must be in (0, 1], got {self.top_p}"),
            (
                within(self.temperature, TEMPERATURE_RANGE),
                f"search.temperature must be from {TEMPERATURE_RANGE[0]:g} to {TEMPERATURE_RANGE[1]:g}, got "
                f"{self.temperature:g}",
            ),
            (self.no_repeat_ngram >= 0, f"search.no_repeat_ngram must be >= 0, got {self.no_repeat_ngram}"),
            (self.min_length >= 0, f"search.min_length must be >= 0, got {self.min_length}"),
            (0 <= self.epsilon < 1, f"search.epsilon must be in [0, 1), got {self.epsilon}"),
            (
                self.seed is None or within(self.seed, SEED_RANGE),
                f"search.seed must be from 0 to 2**64 - 1 = {SEED_RANGE[1]} (torch's generator), got {self.seed}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise message if isinstance(message, ConfigError) else ConfigError(message)
        self._check_mbr()
        if not self.samples:
            changed = [
                f"{name}={value}"
                for name, value, default in [
                    ("top_k", self.top_k, 0),
                    ("top_p", self.top_p, 1.0),
                    ("temperature", self.temperature, 1.0),
                    ("epsilon", self.epsilon, 0.0),
                    ("seed", self.seed, None),
                ]
                if value != default
            ]
            if changed:
                raise ConfigError(
                    f"search.{', search.'.join(changed)} only shape sampling: add --search.sampling true "
                    "(or leave them out for beam search)"
                )

    def unused_beam(self) -> str | None:
        """What to say of a beam other than the default beside a search that samples (it uses none), or None.
        A translator says it in one line and samples; a change that names both is refused (`changed_search`)."""
        if not self.samples or self.beam == DEFAULT_BEAM:
            return None
        if self.sampling:
            return (
                f"search.beam ({self.beam}) is not used by sampling, which draws search.nbest samples per input "
                f"(fairseq's --beam with --sampling): for {self.beam} samples give --search.nbest {self.beam} "
                "and leave search.beam out"
            )
        return (
            f"search.beam ({self.beam}) is not used by MBR over sampled candidates, which draws search.mbr "
            "of them: leave search.beam out, or rank a beam's n-best list with --search.mbr_candidates nbest"
        )

    def samples_drawn(self) -> str | None:
        """What to say of sampling at the default beam and one hypothesis (`--sampling` alone), or None: it
        draws one sample per input, where fairseq's `--sampling` draws `--beam` many (and prints the best
        `--nbest`); here `nbest` is the number of samples, each returned."""
        if not self.sampling or self.beam != DEFAULT_BEAM or self.nbest != 1:
            return None
        return (
            "sampling draws 1 sample per input (search.nbest): for N samples each, give --search.nbest N "
            "(fairseq's --beam N with --sampling; here search.beam is not used)"
        )

    def _check_mbr(self) -> None:
        if not self.mbr:
            changed = [
                f"{name}={value}"
                for name, value, default in [
                    ("mbr_utility", self.mbr_utility, "chrf"),
                    ("mbr_candidates", self.mbr_candidates, "sample"),
                ]
                if value != default
            ]
            if changed:
                raise ConfigError(f"search.{', search.'.join(changed)} only apply to MBR: add --search.mbr N")
            return
        checks = [
            (self.mbr >= 2, f"search.mbr must be 0 (off) or at least 2 candidates, got {self.mbr}"),
            (
                self.mbr_utility in ("chrf", "bleu"),
                f"search.mbr_utility must be 'chrf' or 'bleu', got {self.mbr_utility!r}",
            ),
            (
                self.mbr_candidates in ("sample", "epsilon", "nbest"),
                f"search.mbr_candidates must be 'sample', 'epsilon' or 'nbest', got {self.mbr_candidates!r}",
            ),
            (
                self.nbest == 1,
                f"search.nbest ({self.nbest}) does not apply to MBR, which returns its distinct candidates "
                "ranked by expected utility: leave search.nbest out",
            ),
            (
                self.mbr_candidates != "epsilon" or self.epsilon > 0,
                "search.mbr_candidates epsilon needs --search.epsilon > 0 (e.g. 0.02, Freitag et al. 2023)",
            ),
            (
                self.mbr_candidates != "nbest" or not self.sampling,
                "search.mbr_candidates nbest takes the n-best list of a beam: leave out search.sampling",
            ),
            (
                self.mbr_candidates != "nbest" or self.beam >= self.mbr,
                SearchSettingError(
                    f"search.mbr_candidates nbest takes the {self.mbr}-best list of a beam of {self.beam}: raise ",
                    "beam",
                    f" to at least {self.mbr}",
                ),
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise message if isinstance(message, ConfigError) else ConfigError(message)

    @property
    def samples(self) -> bool:
        """Whether the search samples: `sampling`, or MBR candidates drawn by sampling."""
        return self.sampling or (self.mbr > 0 and self.mbr_candidates != "nbest")

    @property
    def width(self) -> int:
        """Decoder rows per input: the beam, or the number of samples."""
        return self.nbest if self.sampling else self.beam


def layered_search(search: SearchConfig, given: Mapping[str, Any]) -> SearchConfig:
    """The settings `given` (a command line's `--search.*`) over `search` (the model's own: an export's stored
    settings), checked as any settings are: settings that make the search sample without naming a beam leave
    `search`'s beam behind, since sampling uses none. A beam named beside sampling is said by the translator,
    as for settings given over SearchConfig's defaults."""
    merged = {**dataclasses.asdict(search), **given}
    samples = merged["sampling"] or (merged["mbr"] > 0 and merged["mbr_candidates"] != "nbest")
    if samples is True and "beam" not in given:
        given = {**given, "beam": DEFAULT_BEAM}
    return dataclasses.replace(search, **given)


def changed_search(search: SearchConfig, **changes: Any) -> SearchConfig:
    """`search` with some settings changed, what `with_search` gives every engine: as
    [`layered_search`][attnx.inference.config.layered_search], and a beam other than the default named beside
    sampling is refused."""
    changed = layered_search(search, changes)
    if "beam" in changes and (unused := changed.unused_beam()) is not None:
        raise ConfigError(unused)
    return changed


PAPER_SEARCH = SearchConfig()
"""§6.1's search: beam 4, α 0.6 with the GNMT length penalty, maximum output length input + 50."""
