"""TranslationEvaluator: which rows each rank translates, with which search, and in what order they come back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from attnx.data.batch import collate
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.precision import resolve_precision
from attnx.model import build_transformer
from attnx.training.evaluation import TranslationEvaluator
from tests.conftest import tiny_config
from tests.inference.test_phrases import FORMS

MODEL = build_transformer(tiny_config())
"""What the fake modules' translators decode with: the probe is asked about it."""


class Module:
    """Records the translator's search and the rows it was asked to translate (each row's first source id)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self.searches: list[SearchConfig] = []
        self.precisions: list[str] = []

    def translator(self, search: SearchConfig | None = None, precision: str = "32-true"):
        calls = self.calls
        self.searches.append(search)
        resolved = resolve_precision(precision, MODEL)  # as EagerTranslator does: `auto` asks the probe
        self.precisions.append(resolved)

        class Recording:
            precision = resolved

            def translate_tensors(self, src, src_mask):
                calls.append((search.beam, src[:, 0].tolist()))
                assert bool(src_mask[:, -1].any())  # columns no selected row needs are cut
                return [[int(x)] for x in src[:, 0]]

        return Recording()


def batch_of(indices: list[int]):
    lengths = {0: 1, 1: 5, 2: 2, 3: 1, 4: 1, 5: 3}
    pairs = [([10 + i] * lengths[i], [7]) for i in indices]
    return collate(pairs, index=indices)


def stage(rank: int, world: int, validating: bool) -> SimpleNamespace:
    return SimpleNamespace(
        world_size=world,
        global_rank=rank,
        validating=validating,
        sanity_checking=False,
        state=SimpleNamespace(fn=""),
    )


def test_ranks_split_rows_by_corpus_index_and_validation_uses_its_beam() -> None:
    evaluator = TranslationEvaluator(search=SearchConfig(beam=4), bleu_samples=5, valid_beam=1)
    batch = batch_of([0, 1, 2, 3, 4, 5])
    seen = {}
    for rank in (0, 1):
        module = Module()
        evaluator._translations = []
        evaluator.on_validation_batch_end(stage(rank, 2, True), module, None, batch, 0)
        seen[rank] = sorted(i for i, _ in evaluator._translations)
        assert all(beam == 1 for beam, _ in module.calls)
    assert seen == {0: [0, 2, 4], 1: [1, 3]}  # index 5 is past bleu_samples


def test_test_rows_use_the_full_search_and_keep_their_index() -> None:
    evaluator = TranslationEvaluator(search=SearchConfig(beam=4), bleu_samples=0)
    module = Module()
    evaluator.on_test_batch_end(stage(0, 1, False), module, None, batch_of([3, 1, 5]), 0)
    assert [beam for beam, _ in module.calls] == [4]
    assert sorted(evaluator._translations) == [(1, [11]), (3, [13]), (5, [15])]


def test_test_takes_every_search_option_and_validation_stays_a_deterministic_beam() -> None:
    search = SearchConfig(sampling=True, top_p=0.9, seed=3, no_repeat_ngram=3, min_length=2)
    evaluator = TranslationEvaluator(search=search, bleu_samples=5, valid_beam=2)
    module = Module()
    evaluator.on_test_batch_end(stage(0, 1, False), module, None, batch_of([3, 1]), 0)
    evaluator.on_validation_batch_end(stage(0, 1, True), module, None, batch_of([0, 2]), 0)
    test, valid = module.searches
    assert test == search
    assert (valid.sampling, valid.beam, valid.top_p, valid.seed) == (False, 2, 1.0, None)
    assert (valid.no_repeat_ngram, valid.min_length) == (3, 2)


def test_bad_settings_are_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="valid_beam"):
        TranslationEvaluator(valid_beam=0)
    for search in (SearchConfig(beam=4, nbest=2), SearchConfig(alignment=True)):
        with pytest.raises(ValueError, match="evaluation.search.nbest must be 1"):
            TranslationEvaluator(search=search)
    assert torch.equal(batch_of([2]).index, torch.tensor([2]))


def test_decoding_runs_in_the_evaluation_precision_and_a_device_without_it_is_refused_first() -> None:
    import pytest

    from attnx.inference.precision import PrecisionChoice, decoding_probe

    module = Module()
    on_cpu = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")))
    for chosen in ("bf16-mixed", "32-true"):  # auto (the default): the probe's choice, whatever trains
        with decoding_probe(lambda device, decoder, c=chosen: PrecisionChoice(c, "injected")):
            evaluator = TranslationEvaluator(bleu_samples=1)
            evaluator.setup(on_cpu, module, "fit")
            evaluator.on_validation_batch_end(
                stage(0, 1, True), module, None, batch_of([0]), 0
            )  # validate's BLEU
            evaluator.on_test_batch_end(stage(0, 1, False), module, None, batch_of([1]), 0)  # test
            evaluator.on_predict_batch_end(stage(0, 1, False), module, None, batch_of([2]), 0)  # predict
    assert module.precisions == ["bf16-mixed"] * 3 + ["32-true"] * 3
    evaluator = TranslationEvaluator(bleu_samples=0, precision="bf16-mixed")
    with decoding_probe(lambda device, decoder: pytest.fail("probed")):
        evaluator.setup(on_cpu, module, "test")
    evaluator.on_test_batch_end(stage(0, 1, False), module, None, batch_of([1]), 0)
    assert module.precisions[-1] == "bf16-mixed"
    with pytest.raises(ConfigError, match="16-mixed decodes on CUDA devices"):
        TranslationEvaluator(precision="16-mixed").setup(on_cpu, module, "fit")
    for stage_name in ("fit", "validate"):  # validation BLEU off: nothing decodes, nothing is probed or said
        quiet = TranslationEvaluator(bleu_samples=0)
        with decoding_probe(lambda device, decoder: pytest.fail("probed")):
            quiet.setup(on_cpu, module, stage_name)
        assert quiet.decodes_in is None
    with pytest.raises(ConfigError, match="16-mixed decodes on CUDA devices"):
        TranslationEvaluator(bleu_samples=0, precision="16-mixed").setup(on_cpu, module, "fit")


class TwoPrecisions:
    """A module whose translations in bf16-mixed drop the last word of every second sentence."""

    REFERENCES = ["ein Hund läuft im Park .", "zwei Kinder spielen am Strand .", "eine Frau liest ein Buch ."]

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def translator(self, search: SearchConfig | None = None, precision: str = "32-true"):
        references = self.REFERENCES
        resolved = resolve_precision(precision, MODEL)

        class Translating:
            precision = resolved

            def translate_tensors(self, src, src_mask):
                rows = [int(x) - 10 for x in src[:, 0]]  # batch_of's sources start with 10 + index
                return [[i, int(resolved == "bf16-mixed" and i % 2 == 1)] for i in rows]

            def decode(self, ids):
                words = references[ids[0]].split()
                return " ".join(words[:2] if ids[1] else words)

        return Translating()

    def log(self, name: str, value: float, **kw) -> None:
        self.logged[name] = value


def on_test(tmp_path) -> SimpleNamespace:
    corpus = SimpleNamespace(references=lambda split: TwoPrecisions.REFERENCES, tgt_lang="de")
    return SimpleNamespace(
        world_size=1,
        global_rank=0,
        is_global_zero=True,
        testing=True,
        validating=False,
        sanity_checking=False,
        datamodule=SimpleNamespace(corpus=corpus, test_split="test"),
        log_dir=str(tmp_path),
        default_root_dir=str(tmp_path),
        progress_bar_callback=None,
        test_dataloaders=None,
        strategy=SimpleNamespace(broadcast=lambda value, src=0: value, root_device=torch.device("cpu")),
    )


def test_test_compares_a_reduced_precision_with_fp32_when_asked_and_warns_where_it_falls_behind(
    tmp_path, capsys
) -> None:
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    trainer, module = on_test(tmp_path), TwoPrecisions()
    with decoding_probe(lambda device, decoder: PrecisionChoice("bf16-mixed", "injected")):
        for compare in (False, True):
            evaluator = TranslationEvaluator(bleu_samples=0, compare_fp32=compare)
            evaluator.setup(trainer, module, "test")
            evaluator.on_test_epoch_start(trainer, module)
            evaluator.on_test_batch_end(trainer, module, None, batch_of([0, 1, 2]), 0)
            evaluator.on_test_epoch_end(trainer, module)
    assert evaluator.agreement is not None and evaluator.agreement.identical == pytest.approx(2 / 3)
    assert evaluator.agreement.fp32_bleu == pytest.approx(100.0) and not evaluator.agreement.holds
    out, err = capsys.readouterr()
    compared = [line for line in out.splitlines() if line.startswith("bf16-mixed against 32-true on 3 lines")]
    assert len(compared) == 1 and "66.7% of lines identical" in compared[0]  # only when asked
    assert f"attnx test: warning: {compared[0]}" in err.splitlines()
    assert (tmp_path / "test.hyp").read_text().splitlines()[1] == "zwei Kinder"  # what ran: bf16


def test_a_test_in_fp32_has_nothing_to_compare(tmp_path, capsys) -> None:
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    trainer, module = on_test(tmp_path), TwoPrecisions()
    with decoding_probe(lambda device, decoder: PrecisionChoice("32-true", "injected")):
        evaluator = TranslationEvaluator(bleu_samples=0, compare_fp32=True)
        evaluator.setup(trainer, module, "test")
        evaluator.on_test_epoch_start(trainer, module)
        evaluator.on_test_batch_end(trainer, module, None, batch_of([0, 1, 2]), 0)
        evaluator.on_test_epoch_end(trainer, module)
    assert evaluator.agreement is None and "against 32-true" not in capsys.readouterr().out


# --- terminology constraints beside the test set ---------------------------------------------------------------


def test_test_meets_the_phrases_of_a_constraints_file_beside_the_test_set(
    trained, trained_corpus, tmp_path
) -> None:
    import pytest

    from attnx.data.batch import collate as collate_pairs
    from attnx.inference.eager import EagerTranslator

    translator = EagerTranslator.from_checkpoint(trained, search=SearchConfig(beam=4))
    module = SimpleNamespace(
        translator=lambda search=None, precision="32-true": translator.with_search(beam=4)
    )
    references = trained_corpus.references("test")
    trainer = SimpleNamespace(
        **vars(stage(0, 1, False)), datamodule=SimpleNamespace(corpus=trained_corpus, test_split="test")
    )
    lines = [""] * len(references)
    lines[0], lines[3] = '{"include": ["Hund"], "exclude": ["Mann"]}', "Katze\tBall"
    path = tmp_path / "test.constraints"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    evaluator = TranslationEvaluator(search=SearchConfig(beam=4), bleu_samples=0, constraints=str(path))
    evaluator._read_constraints(trainer, module, "test")
    test = trained_corpus.dataset("test")
    batch = collate_pairs(
        [(test[i][0].tolist(), test[i][1].tolist()) for i in range(5)], index=list(range(5))
    )
    evaluator.on_test_batch_end(trainer, module, None, batch, 0)
    texts = {i: translator.decode(ids) for i, ids in evaluator._translations}
    assert "Hund" in texts[0] and "Mann" not in texts[0]
    assert "Katze" in texts[3] and "Ball" in texts[3]
    assert texts[1] == translator.translate([trained_corpus.sources("test")[1]])[0]
    path.write_text("Hund\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=rf"^evaluation.constraints {path} has 1 lines but the test split has"
    ):
        evaluator._read_constraints(trainer, module, "test")
    path.write_text("\n".join(["{bad"] + [""] * (len(references) - 1)) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^evaluation.constraints {path} line 1: not a JSON object"):
        evaluator._read_constraints(trainer, module, "test")


class Constrained:
    """A module whose translations are the whole reference with constraints and its first two words without,
    in every precision: an fp32 pass without the constraints would stray from every line."""

    def __init__(self, miss: bool = False) -> None:
        self.passes: list[tuple[str, Any]] = []  # (precision, constraints) of every decoding pass
        self.miss = miss  # every phrase to include is left out

    def translator(self, search: SearchConfig | None = None, precision: str = "32-true"):
        from attnx.inference.hypothesis import Hypothesis

        passes, resolved, miss = self.passes, resolve_precision(precision, MODEL), self.miss
        searched = search or SearchConfig()

        class Translating:
            precision, search = resolved, searched

            def encode(self, texts):  # a piece a word
                return [[5 + len(word) for word in text.split()] for text in texts]

            def translate_tensors(self, src, src_mask):
                passes.append((resolved, None))
                return [[int(x) - 10, 1] for x in src[:, 0]]

            def generate_tensors(self, src, src_mask, constraints=None):
                passes.append((resolved, constraints))
                met = [[0] if miss and c is not None else [] for c in constraints]
                rows = [int(x) - 10 for x in src[:, 0]]
                return [[Hypothesis([i, 0], 0.0, 0.0, unmet=u)] for i, u in zip(rows, met, strict=True)]

            def decode(self, ids):
                words = TwoPrecisions.REFERENCES[ids[0]].split()
                return " ".join(words[:2] if ids[1] else words)

        return Translating()

    def log(self, name: str, value: float, **kw) -> None:
        pass


def test_compare_fp32_decodes_the_fp32_pass_with_the_same_constraints(tmp_path, capsys) -> None:
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    path = tmp_path / "test.constraints"
    path.write_text('["Hund"]\n\nBall\tKind\n', encoding="utf-8")
    trainer, module = on_test(tmp_path), Constrained()
    with decoding_probe(lambda device, decoder: PrecisionChoice("bf16-mixed", "injected")):
        evaluator = TranslationEvaluator(bleu_samples=0, compare_fp32=True, constraints=str(path))
        evaluator.setup(trainer, module, "test")
        evaluator.on_test_epoch_start(trainer, module)
        evaluator.on_test_batch_end(trainer, module, None, batch_of([0, 1, 2]), 0)
        evaluator.on_test_epoch_end(trainer, module)
    (ours, constraints), (fp32, theirs) = module.passes
    assert (ours, fp32) == ("bf16-mixed", "32-true") and theirs == constraints
    assert [c is not None for c in constraints] == [True, False, True]
    assert evaluator.agreement is not None and evaluator.agreement.identical == 1.0
    assert evaluator.agreement.holds and "warning" not in capsys.readouterr().err


def test_lines_whose_phrases_were_left_out_are_named_with_the_setting_to_change(tmp_path, capsys) -> None:
    """A phrase whose pieces repeat a run of `no_repeat_ngram` pieces is blamed on that setting; any other on
    the maximum length. Lines are the constraints file's."""
    path = tmp_path / "test.constraints"
    path.write_text('["Hund Hund"]\n\nBall\n', encoding="utf-8")
    trainer, module = on_test(tmp_path), Constrained(miss=True)
    evaluator = TranslationEvaluator(
        search=SearchConfig(no_repeat_ngram=1), bleu_samples=0, precision="32-true", constraints=str(path)
    )
    evaluator.on_test_epoch_start(trainer, module)
    evaluator.on_test_batch_end(trainer, module, None, batch_of([0, 1, 2]), 0)
    evaluator.on_test_epoch_end(trainer, module)
    assert evaluator.unmet == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "to include" in line]
    assert len(err) == 2, err
    assert "--evaluation.search.no_repeat_ngram 1 forbids" in err[0] and err[0].endswith("line 1")
    assert "--evaluation.search.max_len_b" in err[1] and err[1].endswith("line 3")


def test_a_constraints_file_ends_its_lines_at_newlines_only(tmp_path) -> None:
    """U+2028, U+0085, a form feed or any other Unicode line separator is part of its line (as `attnx translate`
    reads its files), a `\\r\\n` ends one, and a byte-order mark before the first is dropped: the file has as
    many lines as the split has sentences."""
    texts: list[list[str]] = []
    module = SimpleNamespace(
        translator=lambda: SimpleNamespace(encode=lambda t: texts.append(t) or [[7]] * len(t))
    )
    corpus = SimpleNamespace(references=lambda split: ["a", "b", "c", "d"])
    trainer = SimpleNamespace(datamodule=SimpleNamespace(corpus=corpus, test_split="test"))
    path = tmp_path / "test.constraints"
    lines = ['\ufeff{"include": ["Hund\u2028Katze"]}', "Ball\x0cBall\u0085Ball\tKind", "", '"Frau\u2029"']
    path.write_bytes("\r\n".join(lines).encode("utf-8") + b"\r\n")
    evaluator = TranslationEvaluator(bleu_samples=0, constraints=str(path))
    evaluator._read_constraints(trainer, module, "test")
    assert texts == [["Hund\u2028Katze", "Ball\x0cBall\u0085Ball", "Kind", "Frau"]]
    assert evaluator._phrases is not None and [c is None for c in evaluator._phrases] == [
        False,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize("form", FORMS)
def test_a_constraints_file_line_of_every_form_reads_as_attnx_translate_reads_it(tmp_path, form) -> None:
    line, expected = FORMS[form]
    texts: list[list[str]] = []
    module = SimpleNamespace(
        translator=lambda: SimpleNamespace(encode=lambda t: texts.append(t) or [[7]] * len(t))
    )
    corpus = SimpleNamespace(references=lambda split: ["a", "b"])
    trainer = SimpleNamespace(datamodule=SimpleNamespace(corpus=corpus, test_split="test"))
    path = tmp_path / "test.constraints"
    path.write_bytes(f"{line}\nHund\n".encode())
    evaluator = TranslationEvaluator(bleu_samples=0, constraints=str(path))
    evaluator._read_constraints(trainer, module, "test")
    assert texts == [[*expected.include, *expected.exclude, "Hund"]]
    assert evaluator._phrases is not None and (evaluator._phrases[0] is None) == (not expected)


def test_a_limited_validation_scores_the_first_sentences_of_the_batches_it_validates(capsys) -> None:
    """`trainer.limit_val_batches` may leave out every one of the split's first `bleu_samples` sentences: BLEU then
    scores the first ones of the batches validated (said once) rather than failing on no lines."""
    evaluator = TranslationEvaluator(search=SearchConfig(beam=4), bleu_samples=3, valid_beam=1)
    loader = [batch_of([5, 4]), batch_of([3, 2]), batch_of([1, 0])]
    trainer = stage(0, 1, True)
    trainer.num_val_batches, trainer.val_dataloaders, trainer.is_global_zero = [2], [loader], True
    for _ in range(2):  # two validations: said once
        evaluator.on_validation_epoch_start(trainer, None)
        for batch in loader[:2]:
            evaluator.on_validation_batch_end(trainer, Module(), None, batch, 0)
        assert sorted(i for i, _ in evaluator._translations) == [3, 4, 5]
    assert capsys.readouterr().err.count("validation BLEU scores the first 3 sentences of the batches") == 1
    trainer.num_val_batches = [3]  # the whole split: its first sentences, by corpus index
    evaluator.on_validation_epoch_start(trainer, None)
    for batch in loader:
        evaluator.on_validation_batch_end(trainer, Module(), None, batch, 0)
    assert sorted(i for i, _ in evaluator._translations) == [0, 1, 2]
