"""The spellings a fairseq or Marian user types: short decoding options, the checkpoint under either name,
ensembles as `--model a b` or `a:b`, and a "did you mean" for an option given without its group."""

from __future__ import annotations

import pytest

from attnx.cli import main as attnx_main
from attnx.commands.deploy import export
from attnx.commands.spellings import (
    aliases,
    conflicting_values,
    ensemble_members,
    lightning_aliases,
    list_options,
    several_values,
    with_aliases,
)
from attnx.commands.translate import translate
from attnx.errors import UsageError

LINES = "A dog runs.\nTwo men sit on a bench.\n"
FAST = ["--search.max_len_b", "6"]


def test_short_decoding_spellings_stand_for_the_search_options():
    table = aliases(translate)
    argv = ["--beam", "5", "--nbest=2", "--lenpen", "1.0", "--sampling", "--model", "m.ckpt"]
    assert with_aliases(argv, table) == [
        "--search.beam",
        "5",
        "--search.nbest=2",
        "--search.alpha",
        "1.0",
        "--search.sampling=true",  # a bare flag means true
        "--model",
        "m.ckpt",
    ]
    assert with_aliases(["--sampling", "false"], table) == ["--search.sampling", "false"]
    assert with_aliases(["--alpha", "0.6"], lightning_aliases()) == ["--evaluation.search.alpha", "0.6"]


def test_the_checkpoint_takes_either_name_where_it_is_the_one_model():
    assert aliases(translate)["--ckpt_path"] == "--model"
    assert aliases(export)["--model"] == "--ckpt_path"


def test_a_list_option_takes_several_values_and_fairseqs_colons_make_an_ensemble(tmp_path):
    argv = ["--model", "a.ckpt", "b.ckpt", "--input", "x", "--weights", "0.6", "0.4"]
    assert several_values(translate, argv) == [
        *["--model+", "a.ckpt", "--model+", "b.ckpt", "--input", "x"],
        *["--weights+", "0.6", "--weights+", "0.4"],
    ]
    assert several_values(translate, ["--model", "a.ckpt", "--input", "x"]) == [
        "--model",
        "a.ckpt",
        "--input",
        "x",
    ]
    assert ensemble_members("a.ckpt:b.ckpt") == ["a.ckpt", "b.ckpt"]
    assert ensemble_members(["a.ckpt:b.ckpt", "c.ckpt"]) == ["a.ckpt", "b.ckpt", "c.ckpt"]
    colon = tmp_path / "step:10.ckpt"
    colon.touch()
    assert ensemble_members(str(colon)) == str(colon)  # a file of that name wins
    assert ensemble_members("co:lon/b.ckpt") == "co:lon/b.ckpt"  # missing, and "co" names no model: one path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert attnx_main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_translate_takes_the_short_spellings_and_ensembles_as_fairseq_writes_them(
    checkpoint, tmp_path, capsys
):
    source = tmp_path / "in.en"
    source.write_text(LINES, encoding="utf-8")
    base = ["translate", "--input", str(source), *FAST]
    canonical = run(
        [*base, "--model", str(checkpoint), "--search.beam", "2", "--search.alpha", "1.0"], capsys
    )
    assert run([*base, "--ckpt_path", str(checkpoint), "--beam", "2", "--lenpen", "1.0"], capsys) == canonical

    ensemble = run([*base, "--model", f"[{checkpoint},{checkpoint}]", "--search.beam", "2"], capsys)
    assert run([*base, "--model", str(checkpoint), str(checkpoint), "--beam", "2"], capsys) == ensemble
    assert run([*base, "--model", f"{checkpoint}:{checkpoint}", "--beam", "2"], capsys) == ensemble
    weighted = [*base, "--model", str(checkpoint), str(checkpoint), "--weights", "0.5", "0.5", "--beam", "2"]
    assert run(weighted, capsys) == ensemble
    assert ensemble.count("\n") == 2


def test_export_takes_model_for_its_checkpoint(tmp_path, capsys):
    missing = tmp_path / "missing.ckpt"
    status = attnx_main(
        ["export", "--model", str(missing), "--format", "huggingface", "--output", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert "unrecognized" not in err and ("missing.ckpt does not exist" in err or "needs transformers" in err)
    assert status in (1, 2)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (
            ["translate", "--model", "m.ckpt", "--max_len_b", "5"],
            "--max_len_b: did you mean --search.max_len_b?",
        ),
        (["translate", "--model", "m.ckpt", "--bem", "5"], "--bem: did you mean --beam?"),
        (["serve", "--model", "m.ckpt", "--top_p", "0.9"], "--top_p: did you mean --search.top_p?"),
    ],
)
def test_an_option_without_its_group_gets_a_did_you_mean(argv, hint, capsys):
    assert attnx_main(argv) == 2
    err = capsys.readouterr().err
    assert hint in err and len(err.strip().splitlines()) == 1


def test_help_lists_the_short_spellings(capsys):
    with pytest.raises(SystemExit):
        attnx_main(["translate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "short spellings: --beam for --search.beam" in text
    assert "--lenpen or --alpha for --search.alpha" in text and "--ckpt_path for --model" in text


def test_decoding_lightning_commands_take_the_short_spellings_for_their_evaluation_search(capsys):
    import contextlib

    import yaml

    with contextlib.suppress(SystemExit):
        attnx_main(["test", "--config", "tiny", "--beam", "3", "--lenpen", "0.8", "--print_config"])
    search = yaml.safe_load(capsys.readouterr().out)["evaluation"]["search"]
    assert search["beam"] == 3 and search["alpha"] == 0.8
    assert (
        attnx_main(["fit", "--config", "tiny", "--beam", "3"]) == 2
    )  # fit's validation search: no short names
    assert "(--beam: did you mean --evaluation.search.beam?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--beam", "2", "--search.beam", "5"], "--beam 2 and --search.beam 5 both set --search.beam"),
        (["--nbest", "2", "--nbest=3"], "--nbest 2 and --nbest 3 both set --search.nbest"),
        (["--sampling", "--search.sampling", "false"], "--sampling and --search.sampling false both set"),
        (["--output", "a.txt", "--output", "b.txt"], "--output a.txt and --output b.txt both set --output"),
    ],
)
def test_one_option_set_twice_to_different_values_is_refused_naming_both(argv, message, capsys):
    assert attnx_main(["translate", "--model", "missing.ckpt", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "give it once" in err and len(err.splitlines()) == 1


def test_a_lightning_command_refuses_an_option_set_twice_under_two_spellings(capsys):
    argv = [
        "test",
        "--config",
        "tiny",
        "--ckpt_path",
        "missing.ckpt",
        "--beam",
        "2",
        "--evaluation.search.beam",
        "3",
    ]
    assert attnx_main(argv) == 2
    assert "--beam 2 and --evaluation.search.beam 3 both set" in capsys.readouterr().err
    fit = ["fit", "--config", "tiny", "--trainer.max_steps", "5", "--trainer.max_steps=6"]
    assert attnx_main(fit) == 2
    assert "--trainer.max_steps 5 and --trainer.max_steps 6 both set" in capsys.readouterr().err


def test_repeating_what_a_command_line_may_repeat_is_no_conflict():
    table = aliases(translate)
    lists = list_options(translate)
    conflicting_values(["--beam", "5", "--search.beam", "5.0", "--sampling", "--sampling=true"], table, lists)
    conflicting_values(
        ["--model", "a.ckpt", "--model", "b.ckpt", "--config", "a", "--config", "b"], table, lists
    )
    conflicting_values(  # each callback's own keys after the `+` that appends it
        [
            "--trainer.callbacks+=A",
            "--trainer.callbacks.patience=1",
            "--trainer.callbacks+=B",
            "--trainer.callbacks.patience=2",
        ],
        {},
    )
    with pytest.raises(UsageError, match="--optimizer Adam and --optimizer SGD"):
        conflicting_values(["--optimizer", "Adam", "--optimizer", "SGD"], {})


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["fit", "--config", "tiny", "--trainer.max_step", "5"], "--trainer.max_steps"),
        (["translate", "--model", "missing.ckpt", "--bea", "3"], "--beam"),
        (["translate", "--model", "missing.ckpt", "--search.alph", "0.6"], "--search.alpha"),
    ],
)
def test_an_abbreviated_option_is_refused_with_the_option_it_may_mean(argv, meant, capsys):
    assert attnx_main(argv) == 2
    err = capsys.readouterr().err
    assert f"did you mean {meant}?" in err


def test_a_component_named_alone_is_that_component_with_its_default_arguments(tmp_path) -> None:
    from attnx.commands.spellings import component_names

    spec = tmp_path / "ffn.yaml"
    spec.write_text("name: geglu\n")
    argv = ["--model.transformer.feedforward", "swiglu", "--model.transformer.norm=rmsnorm"]
    argv += [
        "--model.transformer.self_attention",
        str(spec),
        "--model.transformer.positional",
        '{"name": "rope"}',
    ]
    assert component_names(argv) == [
        "--model.transformer.feedforward",
        '{"name": "swiglu"}',
        '--model.transformer.norm={"name": "rmsnorm"}',
        "--model.transformer.self_attention",
        str(spec),
        "--model.transformer.positional",
        '{"name": "rope"}',
    ]
    assert component_names(["--model.transformer.feedforward.name", "swiglu"]) == [
        "--model.transformer.feedforward.name",
        "swiglu",
    ]


def test_fit_and_describe_take_a_component_by_name(tmp_path, capsys) -> None:
    from attnx.cli import main as attnx

    assert attnx(["describe", "--preset", "base", "--model.transformer.feedforward", "swiglu"]) == 0
    assert "feed-forward swiglu" in capsys.readouterr().out
