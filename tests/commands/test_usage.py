"""The command-line plumbing both command systems share: one-line messages, "did you mean" (for options and
for the keys of config files), bare flags, repeated list options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser

from attnx.commands.usage import (
    bare_flags,
    close_key,
    config_file_action,
    one_line,
    option_names,
    refused_command_line,
    repeated_options,
    unknown_keys,
    unknown_options,
)
from attnx.errors import UsageError


def test_one_line_folds_nested_messages_and_drops_repeats() -> None:
    message = 'Parser key "search":\n  - bad value\n  - bad value\n  Option x'
    assert one_line(message) == 'Parser key "search": bad value; Option x'


def test_a_refused_command_line_names_the_close_option() -> None:
    options = ["--beam", "--search.beam", "--output"]
    refused = refused_command_line(
        Exception("unrecognized arguments: --outptu x"), ["--outptu", "x"], options
    )
    assert str(refused) == "unrecognized arguments: --outptu x (--outptu: did you mean --output?)"
    assert refused.exit_code == 2


def test_an_unknown_field_of_a_settings_group_is_named_as_typed() -> None:
    """jsonargparse names the field alone (`'bem'`), inside its account of every type the group may have."""
    message = "Parser key \"search\":\n  Does not validate against any of the Union subtypes\n  Option 'bem' is not accepted"
    refused = refused_command_line(Exception(message), ["--search.bem=2"], ["--search", "--search.beam"])
    assert str(refused) == "unknown option --search.bem (--search.bem: did you mean --search.beam?)"


def test_a_refused_value_keeps_jsonargparse_s_message() -> None:
    message = "Parser key \"trainer.max_steps\":\n  Expected a <class 'int'>. Got value: abc"
    refused = refused_command_line(
        Exception(message), ["--trainer.max_steps", "abc"], ["--trainer.max_steps"]
    )
    assert str(refused) == "Parser key \"trainer.max_steps\": Expected a <class 'int'>. Got value: abc"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_a_number_option_given_nan_or_inf_is_told_it_takes_finite_numbers(value: str) -> None:
    """jsonargparse reads them as text and says only that a float was expected."""
    message = f"Parser key \"ema.decay\":\n  Expected a <class 'float'>. Got value: {value}"
    refused = refused_command_line(Exception(message), ["--ema.decay", value], ["--ema.decay"])
    assert str(refused) == (
        f"Parser key \"ema.decay\": Expected a <class 'float'>. Got value: {value} ({value} is not a finite "
        "number: the option takes finite ones only)"
    )
    plain = refused_command_line(
        Exception(message.replace(value, "abc")), ["--ema.decay", "abc"], ["--ema.decay"]
    )
    assert "finite" not in str(plain)


def test_unknown_options_know_groups_and_the_keys_inside_a_class_valued_option() -> None:
    options = ["--search", "--search.beam", "--trainer.logger", "--names"]
    argv = ["--search.beam=2", "--search", "{}", "--trainer.logger.init_args.save_dir", "x", "--names+", "a"]
    assert unknown_options(argv, options) == []
    assert unknown_options([*argv, "--search.bem", "2", "--trainr.max_steps", "1"], options) == [
        "--search.bem",
        "--trainr.max_steps",
    ]


@dataclass
class Search:
    beam: int = 4


def command(model: str, search: Search | None = None, link: bool = False) -> int:
    return 0


def test_option_names_walk_optional_settings_groups() -> None:
    assert option_names(command) == ["--model", "--search", "--search.beam", "--link"]


def test_a_bare_bool_flag_means_true() -> None:
    assert bare_flags(command, ["--link", "--model", "m"]) == ["--link=true", "--model", "m"]
    assert bare_flags(command, ["--link", "false"]) == ["--link", "false"]


def test_unknown_keys_stop_at_options_and_follow_named_fields() -> None:
    options = ["trainer.max_steps", "trainer.logger", "model.transformer.d_model", "search", "search.beam"]
    config = {
        "trainr": {"max_steps": 3},
        "trainer": {"max_steps": 3, "logger": [{"class_path": "x", "init_args": {"anything": 1}}]},
        "model": {"transformer": {"d_modle": 64}},
        "search": {"beam": 2, "bem": 3},
    }
    assert unknown_keys(config, options) == ["trainr", "model.transformer.d_modle", "search.bem"]


def test_close_key_looks_beside_the_key_then_in_other_sections() -> None:
    options = ["trainer.max_steps", "model.transformer.d_model", "model.lr_factor", "search.beam"]
    assert close_key("trainr", options) == "trainer"
    assert close_key("model.transformer.d_modle", options) == "model.transformer.d_model"
    assert close_key("model.max_steps", options) == "trainer.max_steps"
    assert close_key("beem", options) == "search.beam"
    assert close_key("colour", options) is None


def parser_with_config_file(function) -> ArgumentParser:
    fields = tuple(name.removeprefix("--") for name in option_names(function))
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=config_file_action(fields))
    parser.add_function_arguments(function, as_group=False)
    return parser


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("modle: m\n", "unknown key modle (did you mean model?)"),
        ("search:\n  bem: 3\n", "unknown key search.bem (did you mean search.beam?)"),
    ],
)
def test_a_config_file_key_the_parser_refuses_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "my.yaml"
    config.write_text(text)
    with pytest.raises(UsageError) as raised:
        parser_with_config_file(command).parse_args(["--config", str(config)])
    assert str(raised.value) == f"{config}: {message}"


def test_a_config_file_with_known_keys_parses_as_before(tmp_path: Path) -> None:
    config = tmp_path / "my.yaml"
    config.write_text("model: m\nsearch:\n  beam: 3\n")
    parsed = parser_with_config_file(command).parse_args(["--config", str(config)])
    assert parsed.model == "m" and parsed.search.beam == 3


def many(names: str | list[str] | None = None, one: str = "") -> int:
    return 0


def test_a_repeated_list_option_collects_its_values() -> None:
    argv = ["--names", "a", "--one", "x", "--names=b", "--one", "y"]
    assert repeated_options(many, argv) == ["--names+", "a", "--one", "x", "--names+=b", "--one", "y"]
    assert repeated_options(many, ["--names", "a"]) == ["--names", "a"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_function_arguments(many, as_group=False)
    assert parser.parse_args(repeated_options(many, ["--names", "a", "--names", "b"])).names == ["a", "b"]
