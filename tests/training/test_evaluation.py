"""TranslationEvaluator: which rows each rank translates, with which search, and in what order they come back."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attnx.data.batch import collate
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.training.evaluation import TranslationEvaluator


class Module:
    """Records the translator's search and the rows it was asked to translate (each row's first source id)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self.searches: list[SearchConfig] = []
        self.precisions: list[str] = []

    def translator(self, search: SearchConfig | None = None, precision: str = "32-true"):
        calls = self.calls
        self.searches.append(search)
        self.precisions.append(precision)

        class Recording:
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

    module = Module()
    TranslationEvaluator(bleu_samples=0).on_test_batch_end(stage(0, 1, False), module, None, batch_of([1]), 0)
    evaluator = TranslationEvaluator(bleu_samples=0, precision="bf16-mixed")
    evaluator.on_test_batch_end(stage(0, 1, False), module, None, batch_of([1]), 0)
    assert module.precisions == ["32-true", "bf16-mixed"]  # fp32 unless asked, whatever trains
    on_cpu = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")))
    evaluator.setup(on_cpu, module, "test")
    with pytest.raises(ConfigError, match="16-mixed decodes on CUDA devices"):
        TranslationEvaluator(precision="16-mixed").setup(on_cpu, module, "fit")


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
