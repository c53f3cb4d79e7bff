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


TRAINING_ONLY = ("lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics", "tensorboard")
"""Libraries only training needs: loading, decoding, scoring, exporting and serving import none of them."""

DECODE_AND_SERVE = r"""
import json, sys, traceback

TRAINING_ONLY = json.loads(sys.argv[1])
first = {}


class Watch:  # where each library was first imported from, for the test's message
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in TRAINING_ONLY and top not in first:
            first[top] = "".join(traceback.format_stack(limit=30)[:-1])
        return None


sys.meta_path.insert(0, Watch())
import importlib.util

import attnx
from attnx.cli import main

checkpoint, lightning_checkpoint, work = sys.argv[2:5]
for path in (checkpoint, lightning_checkpoint):
    attnx.load(path, precision="32-true", beam=2, max_len_b=4).translate(["A dog runs.", ""])
fast = ["--device", "cpu", "--precision", "32-true", "--search.beam", "2", "--search.max_len_b", "4"]
with open(f"{work}/in.txt", "w") as f:
    f.write("A dog runs.\n")
commands = [
    ["translate", "--model", checkpoint, "--input", f"{work}/in.txt", "--output", f"{work}/out.txt", *fast],
    ["score", "--hypotheses", f"{work}/out.txt", "--references", f"{work}/in.txt"],
    ["attention", "--model", checkpoint, "--text", "A dog runs.", "--output", f"{work}/a.png",
     "--search.beam", "1", "--search.max_len_b", "4"],
]
if importlib.util.find_spec("ctranslate2"):
    commands += [
        ["export", "--ckpt_path", checkpoint, "--format", "ctranslate2", "--output", f"{work}/ct2"],
        ["translate", "--model", f"{work}/ct2", "--input", f"{work}/in.txt", *fast],
    ]
for argv in commands:
    assert main(argv) == 0, argv
if importlib.util.find_spec("litserve"):
    import attnx.commands.deploy
    from attnx.inference.config import SearchConfig
    from attnx.serving.server import ServeSettings, TranslationAPI, build_server

    search = attnx.load(checkpoint, precision="32-true").search
    build_server(checkpoint, search, ServeSettings(precision="32-true"))
    api = TranslationAPI(checkpoint, search, max_tokens=256, precision="32-true")  # as a worker runs it
    api.setup("cpu")
    assert api.predict([api.decode_request({"text": ["A dog runs."]})])[0]["translations"]
print(json.dumps({"imported": first, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in TRAINING_ONLY)}))
"""


@pytest.mark.slow
def test_loading_decoding_exporting_and_serving_never_import_lightning(checkpoint, tmp_path):
    """`attnx.load`, translate, score, attention, export (and translate of the export) and a server's parts, in
    a fresh interpreter: none imports Lightning or what only training needs (seconds of start-up each), also
    for a checkpoint holding Lightning's dict of hyperparameters, which reads back as a plain dict. A failure
    names the library and where it was first imported from."""
    import json
    import os
    import subprocess
    import sys

    import torch

    lightning_data = pytest.importorskip("lightning.fabric.utilities.data")
    written = torch.load(checkpoint, weights_only=True)
    hyperparameters = lightning_data.AttributeDict(lr_factor=2.0, nested=lightning_data.AttributeDict(a=1))
    torch.save({**written, "hyper_parameters": hyperparameters}, tmp_path / "lightning.ckpt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", DECODE_AND_SERVE, json.dumps(TRAINING_ONLY), str(checkpoint)]
        + [str(tmp_path / "lightning.ckpt"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    where = "\n".join(f"{name} first imported from:\n{stack}" for name, stack in report["imported"].items())
    assert report["loaded"] == [] and report["imported"] == {}, where
