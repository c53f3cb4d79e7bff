"""What the first GPU run of ``attnx fit --config configs/base.yaml`` (and big.yaml) will show: training speed,
MFU and memory of the paper's models in each precision, padding of token-budget batches, decoding speed.

    python bench/bench_gpu.py [--data data/news] [--model base|big|both|tiny] [--precision bf16-mixed ...]
        [--max_tokens 3125 12500] [--tokens_per_step 25000] [--steps 5] [--warmup 2] [--compile] [--fused]
        [--lightning] [--capture graphs compile] [--peers] [--profile] [--decode_sentences 500] [--checkpoint CKPT]
        [--json OUT] [--rows ROWS.jsonl]

It runs on CUDA when a GPU is present, else on the CPU at tiny sizes (a 2+2-layer d_model 64 model, 256-token
batches, two steps) so that it finishes in about a minute: a check that the script works, not a measurement
of the paper's models. Every table is printed under the device and CPU it ran on (``lscpu``'s model name).

Data: a corpus prepared by ``attnx.data.prepare`` (``--data``); with ``--prepare`` the WMT news-test sets
(``--news_raw``: 2008-2012 and 2015-2020 for training, ``--wmt14_raw``: newstest2013 as valid and the full
newstest2014 as test) are prepared there first with the paper's 37k joint vocabulary. Batches are the
training loader's own: token-budget batches of real text in the epoch's seeded order, pinned on CUDA and
copied to the device inside the timed loop, as ``attnx fit`` does.

Training: ``--max_tokens`` is per device and side, as in the configs (3,125 = 25,000 / 8 GPUs). One
optimizer step accumulates ``--tokens_per_step / max_tokens`` batches, so every row trains on the paper's
25k + 25k tokens per step on one GPU (3,125 × 8 or 12,500 × 2). Every row but Lightning's runs in one timed
loop (``gpu_timing.py``) and differs only in its micro-batch step; autocast runs without its cast cache, as
``attnx fit`` runs it. The plain step is ``TranslationTask.training_step``'s without Lightning: :func:`attnx.components.loss.translation_loss` (label smoothing 0.1) under autocast, the
NaN check, backward, fused AdamW (``GradScaler`` loss scaling for fp16). ``--lightning`` adds a row per
configuration that runs the real ``TranslationTask`` in a ``lightning.Trainer`` on the same data, the device
synchronized where timing starts and ends as in the loop (``gpu_lightning.py``); ``--fused``
one with the residual merges and FFN hidden layers compiled into fused kernels (``fuse_pointwise``); ``--peers``
a table of attnx beside Hugging Face's ``MarianMTModel`` and ``torch.nn.Transformer`` with the same dimensions,
trained on the same batches in alternating rounds (``bench/peers.py``).
``--capture graphs`` adds the same loop with each batch shape's forward and backward replayed from a CUDA graph
(attnx's ``StepEngine``, what ``attnx fit`` runs; with ``--lightning`` also a Lightning row with captured
steps), ``--capture compile`` the loop with the loss ``torch.compile``'d in ``mode="reduce-overhead"`` (CUDA
graphs through CUDAGraph Trees, shapes marked dynamic after the second one): every shape of the timed batches is
captured or compiled before the timed steps, its time reported apart. On a CPU ``graphs`` replays by calling
the step again (a check of the script). Reported:

* tokens/s: real (non-padding) source + target tokens per second, and target tokens only (fairseq's ``wps``);
* MFU: model FLOPs (forward + backward of every matmul, attention included, per real token:
  ``training_flops_per_token``) per second over the device's dense bf16 peak, the same denominator for every
  precision: attnx's own ``device_peak_flops``, what ``train/mfu`` divides by (CUDA: the data-sheet table
  ``GPU_PEAKS`` by ``torch.cuda.get_device_name``, else Lightning's; CPU: the fp32 matmul rate measured at
  start, which this CPU reaches and bf16 does not); ``--peak_tflops`` overrides it;
* peak memory: ``torch.cuda.max_memory_allocated`` over the run (CUDA only);
* padding: the share of padded positions in the timed batches.

Decoding: beam 4, α 0.6 over the first ``--decode_sentences`` sentences of the test split, batched by length
within ``--eval_max_tokens``, with the paper's models' random weights unless ``--checkpoint`` names trained
ones. A random model hardly ever ends a sentence, so without a checkpoint the output length is set by
``--max_len_a 1.1 --max_len_b 0`` (German is about 1.1× the English tokens) instead of input + 50.

``--rows FILE`` appends each row's JSON record to FILE (one line) as soon as it is measured: a run cut short
keeps every row before the cut. ``--json`` writes everything at the end.

``--profile`` prints torch.profiler's top operators and kernels for three optimizer steps of the first
configuration: by self CPU time, and on CUDA by self device time too (a step can wait on either); then, from
a fourth step profiled with shapes recorded, the step's copies by the shape they write: a parameter's (the
weights' casts and their gradients'), an activation's, a scalar's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from gpu_data import decode_batches, padding_rows, prepare_news, training_batches
from gpu_decode import decode
from gpu_lightning import train_lightning
from gpu_profile import profile_steps
from gpu_report import TRAIN_HEADER, Rows, padding_table, train_row
from gpu_timing import PRECISIONS
from gpu_training import CAPTURED, TrainResult, failed, model_configs, train_captured, train_plain
from harness import REPO, batch_flops, data_root, machine_line, markdown_row, markdown_table
from harness import machine as host
from peers import run_peers

from attnx.components import attention
from attnx.data.corpus import PreparedCorpus
from attnx.data.prepare import report
from attnx.inference.config import SearchConfig
from attnx.model import build_transformer
from attnx.training.throughput import device_peak_flops, gpu_peak

__all__ = ["TrainResult", "batch_flops", "main", "model_configs", "profile_steps", "training_batches"]
__all__ += ["train_captured", "train_plain"]

PAPER_TOKENS_PER_STEP = 25_000

# --- the machine ------------------------------------------------------------------------------------------


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device.type, "device_name": "cpu", **host()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "device_name": torch.cuda.get_device_name(device),
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return info


def describe(info: dict[str, Any]) -> str:
    text = f"device: {info['device_name']}"
    if info["device"] == "cuda":
        text += f" (sm {info['capability']}, {info['memory_gib']} GiB, CUDA {info['cuda']}, cuDNN {info['cudnn']})"
    return f"{text}; {machine_line(info)}"


def peak_flops(device: torch.device, override_tflops: float | None) -> tuple[float, str]:
    """The MFU denominator and where it comes from: attnx's ``device_peak_flops`` in bf16 on GPUs, in fp32 on
    the CPU."""
    if override_tflops:
        return override_tflops * 1e12, "--peak_tflops"
    if device.type != "cuda":
        source = f"fp32 matmul measured at start on {torch.get_num_threads()} threads"
        return float(device_peak_flops(device, "32-true")), source
    peak = gpu_peak(torch.cuda.get_device_name(device))  # attnx's table, the one train/mfu divides by
    source = (
        f"dense bf16 data-sheet figure for '{peak.key}' ({peak.source})"
        if peak is not None
        else "no GPU_PEAKS entry for this GPU: Lightning's bf16 table (check: it may be a sparse figure), "
        "else a bf16 matmul measured now"
    )
    return float(device_peak_flops(device, "bf16-mixed")), source


# --- the command ------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "news", help="prepared corpus")
    parser.add_argument("--prepare", action="store_true", help="prepare --data from the raw news sets first")
    parser.add_argument("--news_raw", type=Path, default=data_root() / "wmt_newstest_deen_other")
    parser.add_argument("--wmt14_raw", type=Path, default=data_root() / "wmt14_ende_test")
    parser.add_argument("--test_split", default="newstest2014", help="split decoded for sentences/s")
    parser.add_argument("--model", choices=["base", "big", "both", "tiny"], default=None,
                        help="default: both on CUDA, tiny on CPU")  # fmt: skip
    parser.add_argument("--vocab_size", type=int, default=37000, help="model vocabulary (>= the corpus's)")
    parser.add_argument("--precision", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--max_tokens", type=int, nargs="+", default=None,
                        help="per-device budgets; default 3125 12500 on CUDA, 256 on CPU")  # fmt: skip
    parser.add_argument("--tokens_per_step", type=int, default=None,
                        help="tokens per side and optimizer step; default 25000 on CUDA, 2 batches on CPU")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="timed optimizer steps (default 5; CPU 2)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed optimizer steps first (default 2; CPU 1)"
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd layers")
    parser.add_argument("--fused", action="store_true",
                        help="also time fused pointwise kernels (attnx.training.fusion.fuse_pointwise)")  # fmt: skip
    parser.add_argument(
        "--lightning", action="store_true", help="also time TranslationTask in lightning.Trainer"
    )
    parser.add_argument("--no_training", action="store_true",
                        help="leave the training rows out (with --peers: the peers alone)")  # fmt: skip
    parser.add_argument("--peers", action="store_true",
                        help="also train HF MarianMTModel and torch.nn.Transformer on the same batches (bench/peers.py)")  # fmt: skip
    parser.add_argument(
        "--peer_rounds", type=int, default=2, help="--peers: rounds, order reversed each round"
    )
    parser.add_argument(
        "--capture",
        nargs="*",
        choices=list(CAPTURED),
        default=[],
        help="also time the step captured: graphs (CUDA graphs, attnx fit's StepEngine), compile "
        "(torch.compile mode=reduce-overhead)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print the top kernels of the first configuration"
    )
    parser.add_argument(
        "--peak_tflops", type=float, default=None, help="MFU denominator (default: looked up)"
    )
    parser.add_argument(
        "--nan_check",
        choices=["batch", "step"],
        default="step",
        help="read the loss back once per optimizer step (as attnx fit does; default) or every batch",
    )
    parser.add_argument(
        "--cudnn_attention",
        action="store_true",
        help="let CUDA run cuDNN's attention kernel (attnx leaves it out: attention.CUDNN_ATTENTION)",
    )
    parser.add_argument("--decode_sentences", type=int, default=None, help="default 500; CPU 8; 0: skip")
    parser.add_argument("--eval_max_tokens", type=int, default=None, help="decoding budget (8000; CPU 1000)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--checkpoint", type=Path, default=None, help="trained weights for decoding")
    parser.add_argument("--max_len_a", type=float, default=None, help="default 1.1 (random weights) or 1.0")
    parser.add_argument("--max_len_b", type=int, default=None, help="default 0 (random weights) or 50")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument("--rows", type=Path, default=None,
                        help="append each row's JSON record here (one line) as soon as it is measured")  # fmt: skip
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    defaults = {
        "model": "both" if on_gpu else "tiny",
        "max_tokens": [3125, 12500] if on_gpu else [256],
        "steps": 5 if on_gpu else 2,
        "warmup": 2 if on_gpu else 1,
        "decode_sentences": 500 if on_gpu else 8,
        "eval_max_tokens": 8000 if on_gpu else 1000,
        "max_len_a": 1.1 if args.checkpoint is None else 1.0,
        "max_len_b": 0 if args.checkpoint is None else 50,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def accumulation(args: argparse.Namespace, max_tokens: int, on_gpu: bool) -> int:
    if args.tokens_per_step is None:
        return math.ceil(PAPER_TOKENS_PER_STEP / max_tokens) if on_gpu else 2
    return max(1, math.ceil(args.tokens_per_step / max_tokens))


def train_one(args: argparse.Namespace, config, batches, result: TrainResult, device: torch.device) -> None:
    """One row by its variant; an error (a precision or kernel the device lacks) is reported in the row."""
    captured = {v: how for how, v in CAPTURED.items()}
    try:
        if result.variant.startswith("lightning"):
            train_lightning(
                config, args.data, result, device, args.warmup, args.steps, result.variant != "lightning"
            )
        elif result.variant in captured:
            train_captured(config, batches, result, device, args.warmup, captured[result.variant])
        else:
            train_plain(config, batches, result, device, args.warmup, args.nan_check == "batch")
    except Exception as e:  # noqa: BLE001  report it, go on with the next row
        failed(result, e)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    attention.CUDNN_ATTENTION = args.cudnn_attention
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    if args.prepare:
        print(report(prepare_news(args.data, args.news_raw, args.wmt14_raw, args.vocab_size)), flush=True)
    if not (args.data / "meta.json").is_file():
        sys.exit(
            f"{args.data} is not a prepared corpus: run with --prepare (raw sets from --news_raw, --wmt14_raw)"
        )
    corpus = PreparedCorpus(str(args.data))
    if args.vocab_size < corpus.vocab_size:
        sys.exit(f"--vocab_size {args.vocab_size} is below the corpus's vocabulary ({corpus.vocab_size})")
    info = machine(device)
    peak, peak_source = peak_flops(device, args.peak_tflops)
    where = describe(info)
    scale = "" if on_gpu else " — CPU, tiny sizes: checks the script, does not measure the paper's models"
    print(f"# bench_gpu{scale}\n{where}")
    print(f"MFU denominator: {peak / 1e12:.3g} TFLOP/s ({peak_source})")
    kernels = (
        "PyTorch's choice, cuDNN included" if args.cudnn_attention else "cuDNN's left out (attnx's default)"
    )
    print(f"attention kernels on CUDA: {kernels}; the loss is read back every {args.nan_check}")
    print(f"corpus: {args.data} (vocabulary {corpus.vocab_size}; models use {args.vocab_size})\n", flush=True)
    results: dict[str, Any] = {"machine": info, "peak_flops": peak, "peak_source": peak_source,
                               "cudnn_attention": args.cudnn_attention, "nan_check": args.nan_check, "argv": sys.argv}  # fmt: skip
    rows_out = Rows(args.rows)

    budgets = sorted({*args.max_tokens, 3125, 6250, 12500, 25000})
    results["padding"] = [rows_out.add("padding", r) for r in padding_rows(args.data, budgets)]
    print(padding_table(results["padding"], where), flush=True)

    configs = model_configs(args.model, args.vocab_size)
    variants = ["plain"] + ["fused"] * args.fused + ["compiled"] * args.compile
    variants += [CAPTURED[how] for how in args.capture]
    variants += ["lightning"] * args.lightning + ["lightning, captured"] * (
        args.lightning and "graphs" in args.capture
    )
    rows, records = [], []
    if not args.no_training:
        print(f"## Training (optimizer steps of max_tokens × accumulation batches per side)\n{where}\n")
    profiled = False
    for max_tokens in [] if args.no_training else args.max_tokens:
        acc = accumulation(args, max_tokens, on_gpu)
        batches = training_batches(args.data, max_tokens, (args.warmup + args.steps) * acc, pin=on_gpu)
        for name, config in configs.items():
            for precision in args.precision:
                if args.profile and not profiled:
                    print(f"### Profile: {name}, {precision}, {max_tokens} × {acc}, 3 steps\n{where}\n")
                    print(profile_steps(config, batches, precision, acc, device), flush=True)
                    profiled = True
                for variant in variants:
                    result = TrainResult(name, precision, max_tokens, acc, variant)
                    train_one(args, config, batches, result, device)
                    records.append(rows_out.add("training", result.record(peak, info)))
                    rows.append(train_row(result, peak, info["device_name"]))
                    print(markdown_row(rows[-1]), flush=True)
        del batches
    results["training"] = records
    if rows:
        print(f"\n{markdown_table(TRAIN_HEADER, rows)}\n", flush=True)
    if args.peers:
        results["peers"] = run_peers(
            args, configs, lambda budget, n: training_batches(args.data, budget, n, pin=on_gpu),
            lambda budget: accumulation(args, budget, on_gpu), device, peak, info, where,
            lambda record: rows_out.add("peers", record))  # fmt: skip
    results["decoding"] = [rows_out.add("decoding", r) for r in decoding(args, configs, device, info, where)]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    return 0


def decoding(
    args: argparse.Namespace, configs, device: torch.device, info: dict[str, Any], where: str
) -> list:
    """Beam search over the test split's first sentences with each model (or ``--checkpoint``'s), per precision."""
    if args.decode_sentences <= 0:
        return []
    batches = decode_batches(args.data, args.test_split, args.decode_sentences, args.eval_max_tokens)
    search = SearchConfig(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    records, rows = [], []
    for name, config in configs.items():
        if args.checkpoint is not None:
            from attnx.checkpoint import load_model

            loaded = load_model(args.checkpoint, "cpu")
            model, config, name = loaded.model, loaded.config, args.checkpoint.name
        else:
            torch.manual_seed(0)
            model = build_transformer(config)
        search.max_positions = config.max_len
        for precision in args.precision:
            r = decode(model, batches, search, precision, device) | {"model": name, "precision": precision}
            records.append(r | {"machine": info, "search": asdict(search)})
            rows.append([info["device_name"], name, precision, r["sentences"], f"{r['sentences_per_s']:,.1f}",
                         f"{r['output_tokens_per_s']:,.0f}", f"{r['mean_output_tokens']:.1f}"])  # fmt: skip
        if args.checkpoint is not None:
            break
    weights = "trained" if args.checkpoint else "random"
    print(f"## Decoding: beam {args.beam}, α {search.alpha}, max length {args.max_len_a} × input + "
          f"{args.max_len_b}, {weights} weights, budget {args.eval_max_tokens} tokens\n{where}\n")  # fmt: skip
    print(markdown_table(["device", "model", "precision", "sentences", "sentences/s", "output tokens/s",
                          "mean output tokens"], rows))  # fmt: skip
    return records


if __name__ == "__main__":
    sys.exit(main())
