"""`attnx.load`: the engine that reads a path (a checkpoint, an ensemble of checkpoints, a CTranslate2 export),
and one line for what no engine reads."""

from __future__ import annotations

import pytest

import attnx
from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.eager import EagerTranslator
from attnx.inference.load import load
from attnx.inference.translator import Translator

FAST = SearchConfig(beam=2, max_len_b=6)
GREEDY = SearchConfig(beam=1, max_len_b=6)
LINES = ["A man rides a bike.", "", "Two dogs play in the snow."]


def test_a_directory_that_is_no_exported_model_is_refused(tmp_path):
    from attnx.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="not a model exported"):
        attnx.load(tmp_path)


def test_load_returns_the_protocol_both_engines_implement_with_the_text_side_written_once(checkpoint):
    import typing

    from attnx.inference.ctranslate2 import CTranslate2Translator
    from attnx.inference.eager import EagerTranslator
    from attnx.inference.load import load

    assert typing.get_type_hints(load)["return"] is Translator
    assert attnx.Translator is Translator and attnx.load is load
    assert isinstance(attnx.load(checkpoint), EagerTranslator)
    for engine in (EagerTranslator, CTranslate2Translator):
        assert Translator in engine.__mro__
        for name in ("encode", "truncate", "decode", "translate", "__call__"):
            assert getattr(engine, name) is getattr(Translator, name), f"{engine.__name__}.{name}"


def test_a_checkpoint_and_a_list_of_one_checkpoint_are_the_same_model(checkpoint):
    alone = load(checkpoint, search=FAST, max_tokens=64)
    listed = load([str(checkpoint)], search=FAST, max_tokens=64)
    assert isinstance(alone, EagerTranslator) and isinstance(listed, EagerTranslator)
    assert len(alone.models) == len(listed.models) == 1
    assert alone.search == listed.search and alone.max_tokens == listed.max_tokens == 64
    assert alone.translate(LINES) == listed.translate(LINES)


def test_a_list_of_checkpoints_is_one_ensemble_with_its_weights(checkpoint):
    pair = load([checkpoint, checkpoint], search=FAST, weights=[3, 1])
    assert isinstance(pair, EagerTranslator) and len(pair.models) == 2
    assert pair.decoder.weights == [0.75, 0.25]


def test_what_no_engine_reads_is_one_line(checkpoint, tmp_path):
    (tmp_path / "export").mkdir()
    with pytest.raises(ValueError, match=r"^ensemble weights need an ensemble: give a list of checkpoints$"):
        load(checkpoint, weights=[1.0])
    with pytest.raises(ValueError) as err:
        load([checkpoint, tmp_path / "export"])
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'export'} is a directory: an ensemble decodes checkpoint files")
    assert "CTranslate2 exports cannot be ensembled" in message and "\n" not in message


def test_an_exported_directory_is_decoded_by_ctranslate2(checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    from attnx.export import export_ctranslate2
    from attnx.inference.ctranslate2 import CTranslate2Translator

    exported = export_ctranslate2(checkpoint, tmp_path / "ct2")
    translator = load(exported, search=SearchConfig(beam=1, max_len_b=6), max_tokens=64)
    assert isinstance(translator, CTranslate2Translator)
    assert translator.search.beam == 1 and translator.max_tokens == 64
    (output,) = translator.translate_ids([[5, 6, 7]])
    assert len(output) <= translator.max_output_length(3)


def test_an_export_takes_the_compute_type_of_the_precision_asked(checkpoint, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from attnx.export import export_ctranslate2

    exported = export_ctranslate2(checkpoint, tmp_path / "ct2")
    search = SearchConfig(beam=1, max_len_b=6)
    assert load(exported, search=search).compute_type == "float32"  # auto: the tests' timer puts it first
    fp32 = load(exported, search=search, precision="32-true")
    assert fp32.compute_type == "float32"
    assert fp32.translate_ids([[5, 6, 7]]) == load(exported, search=search).translate_ids([[5, 6, 7]])
    if "bfloat16" in ctranslate2.get_supported_compute_types("cpu"):
        assert load(exported, search=search, precision="bf16-mixed").compute_type == "bfloat16"
    else:
        with pytest.raises(ConfigError, match="cannot compute in bfloat16 on this cpu device .*float32"):
            load(exported, search=search, precision="bf16-mixed")
    with pytest.raises(ConfigError, match="choose one of auto, 32-true, bf16-mixed, 16-mixed"):
        load(exported, precision="fp8")


def test_keywords_change_the_models_own_search_settings(checkpoint, tmp_path):
    """`attnx.load(path, nbest=5)`: an export's stored settings (beam 5, |Y|^alpha) with `nbest` changed, as
    `with_search` changes them; `search=SearchConfig(beam=2)` stays the whole search, GNMT's penalty included,
    which CTranslate2 cannot do. A checkpoint's own settings are SearchConfig's defaults."""
    pytest.importorskip("ctranslate2")
    from attnx.export import export_ctranslate2

    stored = SearchConfig(beam=5, length_penalty="fairseq", max_len_b=8)
    exported = export_ctranslate2(checkpoint, tmp_path / "ct2", search=stored)
    nbest5 = load(exported, precision="32-true", nbest=5)
    assert nbest5.search == load(exported, precision="32-true").with_search(nbest=5).search
    assert (nbest5.search.beam, nbest5.search.nbest, nbest5.search.length_penalty) == (5, 5, "fairseq")
    beam2 = load(exported, precision="32-true", beam=2, max_tokens=64)
    assert beam2.search.length_penalty == "fairseq" and beam2.max_tokens == 64
    ids = [[5, 6, 7], [8, 9]]
    assert beam2.translate_ids(ids) == nbest5.with_search(beam=2, nbest=1).translate_ids(ids)
    with pytest.raises(ConfigError, match="CTranslate2 has only the"):
        load(exported, search=SearchConfig(beam=2), precision="32-true")
    fitted = SearchConfig(beam=2, nbest=2, max_positions=64)
    assert load(checkpoint, precision="32-true", beam=2, nbest=2).search == fitted
    assert load([checkpoint], precision="32-true", beam=2, nbest=2).search == fitted
    assert load([checkpoint, checkpoint], weights=[0.5, 0.5], beam=2, nbest=2).search == fitted
    assert load(checkpoint, search=SearchConfig(beam=3, max_len_b=6), nbest=2).search == SearchConfig(
        beam=3, nbest=2, max_len_b=6, max_positions=64
    )


def test_the_averaged_checkpoint_of_a_stopped_run_says_how_to_make_it(checkpoint, tmp_path):
    from attnx.checkpoint import CheckpointError

    folder = tmp_path / "runs" / "multi30k_cpu" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("step=150.ckpt", "last.ckpt"):
        (folder / name).write_bytes(checkpoint.read_bytes())
    with pytest.raises(CheckpointError) as err:
        attnx.load(folder / "averaged.ckpt")
    message = str(err.value)
    assert f"attnx average --dir {folder}" in message and f"or use {folder / 'last.ckpt'}" in message


def test_a_checkpoint_decodes_in_the_precision_auto_chooses_for_its_device(checkpoint, capsys):
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    asked = []
    for chosen in ("bf16-mixed", "32-true"):
        with decoding_probe(
            lambda device, decoder, c=chosen: asked.append(device) or PrecisionChoice(c, "injected")
        ):
            assert load(checkpoint, search=FAST).precision == chosen
            assert load(checkpoint, search=FAST).precision == chosen  # measured once for this model
            assert (
                load([checkpoint, checkpoint], search=FAST).precision == chosen
            )  # an ensemble: measured too
            assert load(checkpoint, search=FAST, precision="32-true").precision == "32-true"  # given: kept
        assert (
            capsys.readouterr().err.splitlines()
            == [
                f"decoding in {chosen}: injected (--precision {'32-true' if chosen != '32-true' else 'bf16-mixed'} "
                "to override)"
            ]
            * 2
        )
    assert [d.type for d in asked] == ["cpu"] * 4  # once per process, device kind and model (or ensemble)


def test_an_export_decodes_in_the_compute_type_a_probe_finds_fastest(checkpoint, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from attnx.export import export_ctranslate2
    from attnx.inference.compute_type import compute_type_probe

    exported = export_ctranslate2(checkpoint, tmp_path / "ct2")
    timed = []
    seconds = {"float32": 1.0, "int8": 0.5, "int8_float32": 0.6}

    def timer(directory, device, threads, types):
        timed.extend(types)
        return {t: seconds.get(t, 2.0) for t in types}

    with compute_type_probe(timer):
        assert load(exported, search=GREEDY).compute_type == "int8"
        assert load(exported, search=GREEDY, precision="32-true").compute_type == "float32"
        assert load(exported, search=GREEDY, compute_type="int8_float32").compute_type == "int8_float32"
        assert load(exported, search=GREEDY).compute_type == "int8"  # measured once
    assert sorted(timed) == sorted(ctranslate2_types())
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("decoding in CTranslate2 int8: the fastest here by a probe (float32 0.50x")


def ctranslate2_types() -> list[str]:
    import ctranslate2

    return list(ctranslate2.get_supported_compute_types("cpu"))
