"""The command-line plumbing both command systems share: one-line messages, "did you mean", bare flags."""

from __future__ import annotations

from dataclasses import dataclass

from attnx.commands.usage import bare_flags, one_line, option_names, suggest


def test_one_line_folds_nested_messages_and_drops_repeats() -> None:
    message = 'Parser key "search":\n  - bad value\n  - bad value\n  Option x'
    assert one_line(message) == 'Parser key "search": bad value; Option x'


def test_suggest_names_the_close_option_and_unknown_group_fields() -> None:
    options = ["--beam", "--search.beam", "--output"]
    assert suggest("Unrecognized arguments: --outptu x", options).endswith(
        "(--outptu: did you mean --output?)"
    )
    nested = suggest("Parser key \"search\": Option 'bem' is not accepted", options)
    assert nested == "unknown option --search.bem (--search.bem: did you mean --search.beam?)"


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
