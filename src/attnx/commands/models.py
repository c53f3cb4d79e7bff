"""`attnx average`, `attnx configs` and `attnx plugins`; `attnx describe` is
[attnx.commands.describe][]'s."""

from __future__ import annotations

from pathlib import Path

from attnx.errors import ConfigError, UsageError
from attnx.registry import Kind


def average(
    checkpoints: Path | list[Path] | None = None,
    dir: Path | None = None,
    last: int = 5,
    output: Path = Path("averaged.ckpt"),
    force: bool = False,
) -> int:
    """Average the weights of several checkpoints of one run into one decodable checkpoint.

    §6.1: the last 5 checkpoints for the base model, the last 20 for the big one. The result carries no
    optimizer state: it decodes (attnx test, attnx translate) but does not resume training.
    Example: attnx average --dir runs/base/version_0/checkpoints --last 5 --output base.ckpt

    Args:
        checkpoints: Checkpoint files to average: --checkpoints '[a.ckpt, b.ckpt]'.
        dir: Take the newest checkpoints by training step from this directory instead: the step=N.ckpt
            files, and last.ckpt where it holds a later step (a run stopped between two saves).
        last: With --dir: how many of the newest.
        output: Where to write the averaged checkpoint.
        force: Replace the --output file if it exists (otherwise an existing file is left and the command stops).
    """
    import sys

    from attnx.checkpoint import CheckpointError, atomic_save, average_checkpoints, last_checkpoints
    from attnx.checkpoint.ema import checkpoint_weights_line
    from attnx.commands.usage import refuse_to_replace

    if bool(checkpoints) == bool(dir):
        raise ConfigError("give either --checkpoints or --dir (with --last k), not both and not neither")
    if last < 1:
        raise ConfigError(f"--last must be at least 1, got {last}")
    if isinstance(checkpoints, Path):
        checkpoints = [checkpoints]
    paths = last_checkpoints(dir, last) if dir else list(checkpoints or [])
    if dir and len(paths) < last:
        print(f"attnx average: only {len(paths)} checkpoints in {dir}; averaging those", file=sys.stderr)
    if not paths:
        raise CheckpointError("no checkpoints to average")
    refuse_to_replace(output, force)
    atomic_save(average_checkpoints(paths), output)
    if ema := checkpoint_weights_line(paths[-1], "average"):
        print(ema)
    print(f"averaged {len(paths)} checkpoints into {output}:")
    for path in paths:
        print(f"  {path}")
    return 0


def configs() -> int:
    """List the configs shipped with attnx, one line each; pass a name to --config (attnx fit --config base)."""
    from attnx.configs import available

    found = available()
    width = max(map(len, found), default=0)
    for name, line in found.items():
        print(f"{name:<{width}}  {line}")
    return 0


def plugins(kind: str | None = None) -> int:
    """List every registered component by kind, with the plugin and distribution it came from, and the arguments
    a config sets (`args`): each with its default and the first words of its doc.

    Below each kind, the keys that choose a component of it and set its arguments, in a config file and on the
    command line of `attnx fit`: e.g. `--model.transformer.self_attention.args.kv_heads 2` (grouped-query
    attention). The arguments the model passes a component itself (d_model, n_heads, ...) are named apart.

    Args:
        kind: List only the components of this kind: attention, feedforward, positional, norm or loss.
    """
    import difflib

    from attnx.commands.component_args import listing
    from attnx.plugins import registry

    kinds = [str(k) for k in Kind]
    if kind is not None and kind not in kinds:
        close = difflib.get_close_matches(kind, kinds, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"--kind {kind}: no such kind of component ({hint}the kinds: {', '.join(kinds)})")
    for line in listing(registry(), [Kind(kind)] if kind else list(Kind)):
        print(line)
    return 0
