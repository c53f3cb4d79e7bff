"""What LoRA and activation checkpointing save: trainable parameters and peak memory of a real `attnx fit`, beside
what `attnx describe --device cpu` estimates, with and without each option (docs/training.md, "Measuring
the options on your machine").

    python bench/bench_memory_options.py --work memory_runs [--data DIR] [--preset base] [--steps 10]
        [--max_tokens 1000] [--lora_rank 8] [--precision 32-true] [--threads 2] [--output table.md]

Every arm trains the paper's `--preset` model (base: 6+6 layers, d_model 512, 48M parameters with Multi30k's
8k vocabulary, the paper's 65M with its 37k: big enough that optimizer state and activations dominate the
process) on Multi30k with the README's recipe (configs/multi30k_cpu.yaml) for `--steps` optimizer updates of
`--max_tokens` tokens a side, without validation or checkpoints on the way. Arms (ARMS below): the plain
model, activation checkpointing (`model.transformer.activation_checkpointing: true`), LoRA (`--lora.rank`,
adapters on attention's projections, the rest frozen: a fresh model stands in for the one `--init_from` would
load, the memory is the same) and both. Per arm: the trainable parameters and all of them (`attnx describe`'s count), the peak
resident memory of the whole `attnx fit` process (`ru_maxrss` of the child, Linux: interpreter, libraries and
data included, so the differences between arms are what the options change), and the estimate `attnx describe
--device cpu` prints for the same config (weights, gradients, Adam, activations). Expected wall time: a few
minutes per arm for base at the defaults on a 2-core CPU.

Every command is printed and logged in WORK/logs; the prepared corpus is reused by a second run. `--train_lines`
cuts the training corpus for a smoke test of the script only: its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from attnx_steps import MODEL_CONFIG, Steps, add_step_options
from harness import publish

ARMS: dict[str, dict[str, bool]] = {
    "plain": {"checkpointing": False, "lora": False},
    "activation checkpointing": {"checkpointing": True, "lora": False},
    "lora": {"checkpointing": False, "lora": True},
    "lora + activation checkpointing": {"checkpointing": True, "lora": True},
}
"""Which options each arm turns on."""

COLUMNS = [
    "run",
    "trainable parameters",
    "all parameters",
    "peak RSS of attnx fit",
    "describe's estimate",
    "of which activations",
    "seconds",
]


def arm_config(
    steps: Steps, arm: str, data: Path, preset: str, options: argparse.Namespace
) -> tuple[Path, dict[str, Any]]:
    """The override config of an arm, complete for `attnx describe` (which reads the trainer and data sections
    of the last file it is given): the model, the budget, the batch size, the options."""
    from attnx.model import TransformerConfig

    shape = dataclasses.asdict(getattr(TransformerConfig, preset)())
    model = {key: shape[key] for key in ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers")}
    model["activation_checkpointing"] = ARMS[arm]["checkpointing"]
    trainer = {
        "precision": options.precision,
        "max_steps": options.steps,
        "max_time": None,
        "val_check_interval": 10**9,  # no validation: the memory of training alone
        "log_every_n_steps": max(1, options.steps // 5),
        "callbacks": [],  # no periodic checkpoints, averaging or thread probes
        "logger": {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": "runs", "name": "memory_" + arm.replace(" + ", "_").replace(" ", "_")},
        },
    }
    values: dict[str, Any] = {
        "trainer": trainer,
        "model": {"transformer": model},
        "data": {"data_dir": str(data), "max_tokens": options.max_tokens},
    }
    if ARMS[arm]["lora"]:
        values["lora"] = {"rank": options.lora_rank}
    path = steps.work / "configs" / f"memory_{arm.replace(' + ', '_').replace(' ', '_')}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    return path, values


def peak_rss(steps: Steps, name: str, argv: list[str]) -> tuple[int, float]:
    """Run `attnx ARGV` in the work directory (output in logs/NAME.log); its peak resident bytes (`ru_maxrss`
    of that child alone, `os.wait4`) and the seconds it took."""
    print(f"$ attnx {shlex.join(argv)}", flush=True)
    start = time.perf_counter()
    with open(steps.logs / f"{name}.log", "w", encoding="utf-8") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "attnx", *argv],
            cwd=steps.work,
            env=steps.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"attnx {argv[0]} failed ({child.returncode}): see {steps.logs / name}.log")
    return usage.ru_maxrss * 1024, time.perf_counter() - start  # ru_maxrss: KiB on Linux


def described(text: str) -> dict[str, str]:
    """What `attnx describe --device cpu` printed: parameters, trainable ones, estimated memory, activations."""
    parameters = re.search(r"^parameters: ([\d,]+)", text, re.MULTILINE)
    trainable = re.search(r"; ([\d,]+) of them train", text)
    memory = re.search(r"estimated memory per device: ([\d.,]+ [KMG]iB)", text)
    activations = re.search(r"activations ([\d.,]+ [KMG]iB)", text)
    if not (parameters and memory and activations):
        raise SystemExit(f"attnx describe printed no parameter count or estimate:\n{text}")
    return {
        "parameters": parameters.group(1),
        "trainable": trainable.group(1) if trainable else parameters.group(1),
        "memory": memory.group(1),
        "activations": activations.group(1),
    }


def size(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_options(parser)
    parser.add_argument(
        "--preset", choices=("base", "big"), default="base", help="the paper's model to train"
    )
    parser.add_argument("--steps", type=int, default=10, help="optimizer updates of every arm")
    parser.add_argument("--max_tokens", type=int, default=1000, help="tokens a side of a training batch")
    parser.add_argument("--lora_rank", type=int, default=8, help="--lora.rank of the LoRA arms")
    parser.add_argument("--precision", default="32-true", help="--trainer.precision of every arm")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--train_lines", type=int, help="smoke test only: train on the first N pairs")
    args = parser.parse_args(argv)
    arms = [arm.strip() for arm in args.arms.split(",")]
    if unknown := [arm for arm in arms if arm not in ARMS]:
        parser.error(f"--arms: unknown {unknown}; choose among {', '.join(ARMS)}")
    steps = Steps.from_args(args)
    data, _, _ = steps.multi30k(args.train_lines)
    rows, commands = [], []
    for arm in arms:
        config, _ = arm_config(steps, arm, data, args.preset, args)
        name = f"memory_{arm.replace(' + ', '_').replace(' ', '_')}"
        fit = ["fit", "--config", MODEL_CONFIG, "--config", str(config)]
        describe = ["describe", "--config", MODEL_CONFIG, "--config", str(config), "--device", "cpu"]
        commands += [f"attnx {shlex.join(fit)}", f"attnx {shlex.join(describe)}"]
        steps.attnx(f"describe_{name}", *describe)
        estimate = described((steps.logs / f"describe_{name}.log").read_text(encoding="utf-8"))
        peak, seconds = peak_rss(steps, f"fit_{name}", fit)
        rows.append([arm, estimate["trainable"], estimate["parameters"], size(peak), estimate["memory"],
                     estimate["activations"], f"{seconds:.0f}"])  # fmt: skip
    title = (
        f"LoRA (rank {args.lora_rank}) and activation checkpointing: the {args.preset} model, {args.steps} update{'s' * (args.steps != 1)} "
        f"of {args.max_tokens:,} tokens a side, {args.precision}"
    )
    publish(title, COLUMNS, rows, args.output)
    lines = ["commands (each arm's config in WORK/configs):", *(f"    {command}" for command in commands)]
    print("\n".join(lines))
    if args.output:
        with open(args.output, "a", encoding="utf-8") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
