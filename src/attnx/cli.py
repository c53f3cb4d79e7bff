"""The ``attnx`` command: one table of subcommands, each a module with ``main(argv) -> int``."""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "download": (
        "attnx.data.download",
        "fetch Multi30k / WMT14 en-de raw text (or copy from a local directory)",
    ),
    "prepare": ("attnx.data.prepare", "train the joint SentencePiece model and binarize a parallel corpus"),
    "fit": ("attnx.training.cli", "train a model from a config (LightningCLI)"),
    "validate": ("attnx.training.cli", "compute validation loss/BLEU of a checkpoint (LightningCLI)"),
    "test": ("attnx.training.cli", "beam-search a test set and score it with sacreBLEU (LightningCLI)"),
    "predict": ("attnx.training.cli", "decode the test split of a config's data (LightningCLI)"),
    "average": ("attnx.inference.average", "average the weights of several checkpoints into one"),
    "translate": ("attnx.inference.translate", "translate text (file or stdin) with a checkpoint"),
    "attention": ("attnx.inference.attention_map", "draw a layer's attention heads for a sentence to a PNG"),
    "plugins": ("attnx.commands", "list every registered component by kind, with its distribution"),
    "describe": ("attnx.commands", "parameter count and training FLOPs per token of a model config"),
}

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: attnx <command> [options]   (attnx <command> --help for a command's options)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        from attnx import __version__

        print(f"attnx {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"attnx: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    if name in LIGHTNING_COMMANDS:
        return module.main([name, *rest])
    if module.__name__ == "attnx.commands":
        return getattr(module, name)(rest)
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
