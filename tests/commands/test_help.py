"""Every `--help` reads as plain text: Lightning's reST docstrings are rewritten, and an option with a default is
not called required."""

from __future__ import annotations

from dataclasses import dataclass

from jsonargparse import ArgumentParser

from attnx.commands.help import help_formatter, plain_help


def test_lightning_s_docstrings_are_still_restructuredtext() -> None:
    """What plain_help exists for: when Lightning writes its Trainer's docstring in Markdown, it can go."""
    from lightning.pytorch import Trainer

    doc = Trainer.__init__.__doc__
    assert "``" in doc and ":paramref:`~lightning.pytorch" in doc and ":class:`" in doc


def test_plain_help_writes_rest_as_markdown_code() -> None:
    text = "Defaults to ``True``; see :paramref:`~lightning.pytorch.Trainer.callbacks`\nand :func:`torch.no_grad`.\nExample::\n"
    assert plain_help(text) == (
        "Defaults to `True`; see `lightning.pytorch.Trainer.callbacks`\nand `torch.no_grad`.\nExample:\n"
    )


@dataclass
class Spec:
    """A component.

    Attributes:
        name: Which one.
    """

    name: str = "multihead"


def settings(spec: Spec) -> None:
    """Args:
    spec: The component.
    """


def test_an_option_with_a_default_is_not_called_required() -> None:
    parser = ArgumentParser(formatter_class=help_formatter())
    parser.add_function_arguments(settings)
    text = parser.format_help()
    assert "default: multihead" in text and "required, type: str, default: multihead" not in text
