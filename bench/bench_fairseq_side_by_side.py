"""Training throughput of attnx and fairseq side by side, in one run on one machine, fp32 on CPU.

    python bench/bench_fairseq_side_by_side.py --fairseq_python FAIRSEQ_VENV/bin/python
        [--data data/multi30k] [--config configs/multi30k_cpu.yaml] [--steps 20] [--warmup 3]
        [--threads 1 2] [--repeats 2] [--work /tmp/attnx_vs_fairseq]

Both train on the same data: the training pairs of the prepared corpus (``attnx prepare ... --vocab_size 8000
--out data/multi30k``), written out as their SentencePiece pieces and binarized by ``fairseq-preprocess``
with a dictionary of exactly those pieces, so fairseq sees the same token sequences over the same 8,000
ids. Both build the model of ``--config``'s ``model.transformer`` section (3+3 layers, d_model 256, 4 heads,
d_ff 1024, post-norm, sinusoidal positions, all embeddings shared), train with label smoothing 0.1 and
Adam(0.9, 0.98) with ``--max_tokens`` padded tokens per side per batch, and run ``--steps`` timed training
steps after ``--warmup`` untimed ones, alternating between the two toolkits, ``--repeats`` times for each
thread count. The best and the median run are printed.

* ``attnx step``: ``TranslationTask``'s training step in a plain loop (``bench/bench_train.py``'s ``attnx``).
* ``attnx Trainer.fit``: the same inside Lightning's ``Trainer.fit`` (``bench/bench_train.py``'s ``lightning``).
* ``fairseq Trainer.train_step``: fairseq's own trainer, criterion (``label_smoothed_cross_entropy``) and
  optimizer (``adam``), as ``fairseq-train`` runs each update, without its logging.

fairseq runs in its own virtual environment (``--fairseq_python``): its last release, 0.12.2, does not import
on Python 3.11 (a dataclass with a mutable default), so that environment is Python 3.10 with the same torch
version, ``pip install torch==2.13.0 "numpy<1.24" fairseq==0.12.2`` (docs/benchmarks.md). Tokens count real
tokens, end-of-sentence included, padding excluded: source + target, and target alone (fairseq's ``wps``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from bench_train import EPSILON, add_training_data_options, lightning, manual, training_data
from harness import cpu_model, load_average, run_timed

from attnx.data.corpus import PreparedCorpus
from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters

# Run by the fairseq interpreter: one timed training run, its result as JSON on the last line.
FAIRSEQ_RUN = r"""
import json, sys, time
import numpy as np
import torch
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
import fairseq
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), spec["argv"]))
np.random.seed(cfg.common.seed)
utils.set_torch_seed(cfg.common.seed)
task = tasks.setup_task(cfg.task)
task.load_dataset("train", combine=False, epoch=1)
model = task.build_model(cfg.model)
criterion = task.build_criterion(cfg.criterion)
trainer = Trainer(cfg, task, model, criterion)
batches = trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=True)
src = tgt = 0
start = None
for i, sample in enumerate(batches):
    if i == spec["warmup"]:
        start = time.perf_counter()
    if i >= spec["warmup"]:
        src += int(sample["net_input"]["src_lengths"].sum())
        tgt += int(sample["ntokens"])
    trainer.train_step([sample])
    if i + 1 == spec["warmup"] + spec["steps"]:
        break
seconds = time.perf_counter() - start
print(json.dumps({
    "seconds": seconds, "src_tokens": src, "tgt_tokens": tgt,
    # fairseq 0.12.2's encoder layers also hold copies of their weights for an inference fast path;
    # those get no gradient: count what trains
    "params": sum(p.numel() for p in model.parameters() if p.grad is not None),
    "params_total": sum(p.numel() for p in model.parameters()),
    "vocab": len(task.source_dictionary), "fairseq": fairseq.__version__, "torch": torch.__version__,
}))
"""


def export_for_fairseq(corpus: PreparedCorpus, work: Path, fairseq_python: str) -> Path:
    """The training pairs as SentencePiece pieces, binarized by fairseq-preprocess over the same vocabulary."""
    bin_dir = work / "bin"
    stamp = work / "source.json"
    source = {"data": str(corpus.data_dir.resolve()), "meta": corpus.meta}
    if stamp.is_file() and json.loads(stamp.read_text()) == source and (bin_dir / "dict.en.txt").is_file():
        return bin_dir
    work.mkdir(parents=True, exist_ok=True)
    sp = corpus.tokenizer.sp
    pieces = [sp.id_to_piece(i) for i in range(corpus.vocab_size)]
    # fairseq puts its own <s> <pad> </s> <unk> first; attnx's ids 0-3 are pad, unk, <s>, </s>
    (work / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces[4:]), encoding="utf-8")
    data = corpus.dataset("train")
    with (
        open(work / "train.en", "w", encoding="utf-8") as en,
        open(work / "train.de", "w", encoding="utf-8") as de,
    ):
        for i in range(len(data)):
            src, tgt = data[i]
            en.write(" ".join(pieces[t] for t in src) + "\n")
            de.write(" ".join(pieces[t] for t in tgt) + "\n")
    command = [fairseq_python, "-m", "fairseq_cli.preprocess", "--source-lang", corpus.src_lang]
    command += [
        "--target-lang",
        corpus.tgt_lang,
        "--trainpref",
        str(work / "train"),
        "--destdir",
        str(bin_dir),
    ]
    command += ["--srcdict", str(work / "dict.txt"), "--joined-dictionary", "--workers", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fairseq-preprocess failed:\n{done.stderr[-3000:]}")
    stamp.write_text(json.dumps(source))
    return bin_dir


def fairseq_argv(bin_dir: Path, config: TransformerConfig, section: dict, max_tokens: int) -> list[str]:
    """fairseq-train's options for the model and training of the attnx config."""
    d, f, h = str(config.d_model), str(config.d_ff), str(config.n_heads)
    model = section["model"]
    return [
        str(bin_dir), "--cpu", "--seed", "1", "--num-workers", "0",
        "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", str(config.encoder_layers), "--decoder-layers", str(config.decoder_layers),
        "--encoder-embed-dim", d, "--decoder-embed-dim", d,
        "--encoder-ffn-embed-dim", f, "--decoder-ffn-embed-dim", f,
        "--encoder-attention-heads", h, "--decoder-attention-heads", h,
        "--dropout", str(config.dropout), "--attention-dropout", "0", "--activation-dropout", "0",
        "--max-source-positions", str(config.max_len), "--max-target-positions", str(config.max_len),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(EPSILON),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(model.get("warmup_steps", 4000)),
        "--lr", "1e-3", "--max-tokens", str(max_tokens), "--required-batch-size-multiple", "1",
        "--disable-validation", "--no-save",
    ]  # fmt: skip


def run_fairseq(fairseq_python: str, argv: list[str], threads: int, steps: int, warmup: int) -> dict:
    spec = json.dumps({"argv": argv, "threads": threads, "steps": steps, "warmup": warmup})
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([fairseq_python, "-c", FAIRSEQ_RUN, spec], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"the fairseq run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fairseq_python", required=True, help="python of a virtual environment with fairseq"
    )
    add_training_data_options(parser)
    parser.add_argument("--max_tokens", type=int, default=None, help="default: the config's data.max_tokens")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch.set_num_threads values")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each toolkit per thread count")
    parser.add_argument("--work", type=Path, default=Path("/tmp/attnx_vs_fairseq"), help="fairseq's data")
    args = parser.parse_args(argv)
    setup = training_data(args.data, args.config, args.max_tokens, args.warmup + args.steps)
    config, datamodule, batches, max_tokens = setup.config, setup.datamodule, setup.batches, setup.max_tokens
    corpus = datamodule.corpus
    bin_dir = export_for_fairseq(corpus, args.work, args.fairseq_python)
    measured = batches[args.warmup :]
    attnx_src = sum(b.n_src_tokens for b in measured)
    attnx_tgt = sum(b.n_tgt_tokens for b in measured)
    f_argv = fairseq_argv(bin_dir, config, setup.section, max_tokens)

    # rows: (toolkit, threads) -> list of (src+tgt tokens/s, tgt tokens/s)
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    about_fairseq: dict = {}
    loads = [load_average()]
    for threads in args.threads:
        torch.set_num_threads(threads)
        for _ in range(args.repeats):
            seconds = manual(config, batches, args.warmup, naive=False)
            results.setdefault(("attnx step", threads), []).append(
                ((attnx_src + attnx_tgt) / seconds, attnx_tgt / seconds)
            )
            seconds = lightning(config, datamodule, args.steps, args.warmup)
            results.setdefault(("attnx Trainer.fit", threads), []).append(
                ((attnx_src + attnx_tgt) / seconds, attnx_tgt / seconds)
            )
            about_fairseq = run_fairseq(args.fairseq_python, f_argv, threads, args.steps, args.warmup)
            seconds = about_fairseq["seconds"]
            src, tgt = about_fairseq["src_tokens"], about_fairseq["tgt_tokens"]
            results.setdefault(("fairseq Trainer.train_step", threads), []).append(
                ((src + tgt) / seconds, tgt / seconds)
            )
            loads.append(load_average())

    with torch.device("meta"):
        attnx_params = count_parameters(build_transformer(config))
    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; 1-minute load average {min(loads):.1f}-{max(loads):.1f} "
        f"during the run\nattnx: torch {torch.__version__}, Python {sys.version.split()[0]}, "
        f"{attnx_params:,} parameters, vocabulary {corpus.vocab_size}, {attnx_src + attnx_tgt:,} source+target "
        f"tokens in {args.steps} timed batches\nfairseq {about_fairseq['fairseq']}: torch "
        f"{about_fairseq['torch']}, {about_fairseq['params']:,} trained parameters ({about_fairseq['params_total']:,} with the copies its "
        f"encoder layers keep for inference), vocabulary {about_fairseq['vocab']}, "
        f"{about_fairseq['src_tokens'] + about_fairseq['tgt_tokens']:,} source+target tokens in {args.steps} "
        f"timed batches\nmodel {config.encoder_layers}+{config.decoder_layers} layers, d_model "
        f"{config.d_model}, {config.n_heads} heads, d_ff {config.d_ff}; max_tokens {max_tokens}; fp32; "
        f"{args.repeats} runs each, alternating\n"
    )
    print("| toolkit | threads | source+target tokens/s, best | median | target tokens/s, best | median |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, threads), runs in results.items():
        both, target = [r[0] for r in runs], [r[1] for r in runs]
        print(
            f"| {name} | {threads} | {max(both):,.0f} | {statistics.median(both):,.0f} | "
            f"{max(target):,.0f} | {statistics.median(target):,.0f} |"
        )
    return 0


if __name__ == "__main__":
    run_timed(main)
