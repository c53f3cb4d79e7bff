"""Train a Multi30k en→de checkpoint with a plain PyTorch loop, for the export benchmark.

The same recipe as ``configs/multi30k_cpu.yaml`` (3+3 layers, d_model 256, 4 heads, d_ff 1024, 8k joint BPE,
label smoothing 0.1, Adam β = (0.9, 0.98), Eq. 3 with a short warm-up, last snapshots averaged), without
Lightning, so that the export benchmark has a meaningful model whatever state the training command is in::

    nice python bench/train_checkpoint.py --raw_dir raw/multi30k \\
        --work_dir /tmp/multi30k_export --out ckpt/multi30k.ckpt --minutes 15

``--work_dir`` receives the prepared corpus (``attnx prepare``'s format); ``--out`` the averaged checkpoint,
written with ``attnx.checkpoint.save_model``. The model is that config's ``model.transformer`` section.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from harness import model_config

from attnx.checkpoint import save_model
from attnx.components.loss import translation_loss
from attnx.data.batching import collate_indices, plan_batches
from attnx.data.corpus import PreparedCorpus
from attnx.data.prepare import Inputs, Settings, prepare
from attnx.model import build_transformer
from attnx.training.schedule import lr_lambda


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--raw_dir", type=Path, required=True, help="folder with train/val/test_2016_flickr")
    parser.add_argument("--work_dir", type=Path, required=True, help="where the prepared corpus goes")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint to write")
    parser.add_argument("--minutes", type=float, default=15.0, help="training time (default 15)")
    parser.add_argument("--snapshot_minutes", type=float, default=1.5, help="snapshot interval (default 1.5)")
    parser.add_argument("--average", type=int, default=5, help="last snapshots averaged (default 5)")
    parser.add_argument("--max_tokens", type=int, default=2500, help="padded tokens per side and batch")
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--lr_factor", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    inputs = Inputs.from_prefixes(
        {
            "train": [args.raw_dir / "train"],
            "valid": [args.raw_dir / "val"],
            "test": [args.raw_dir / "test_2016_flickr"],
        },
        "en",
        "de",
    )
    prepare(inputs, args.work_dir, Settings("en", "de", vocab_size=8000))
    corpus = PreparedCorpus(args.work_dir)
    train = corpus.dataset("train")
    config = model_config(corpus.vocab_size)
    model = build_transformer(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(config.d_model, args.warmup, args.lr_factor)
    )
    order, bounds = plan_batches(train.src_lengths, train.tgt_lengths, args.max_tokens, seed=args.seed)
    batches = [order[bounds[k] : bounds[k + 1]] for k in range(len(bounds) - 1)]
    rng = np.random.default_rng(args.seed)

    start = last_snapshot = time.monotonic()
    snapshots: list[dict[str, torch.Tensor]] = []
    step, epoch, tokens = 0, 0, 0
    while time.monotonic() - start < args.minutes * 60:
        for k in rng.permutation(len(batches)):
            batch = collate_indices(train, batches[k])
            sums = translation_loss(model, batch, 0.1)
            optimizer.zero_grad(set_to_none=True)
            (sums.loss / sums.tokens).backward()
            optimizer.step()
            schedule.step()
            step += 1
            tokens += batch.n_src_tokens + batch.n_tgt_tokens
            now = time.monotonic()
            if step % 100 == 0:
                print(
                    f"epoch {epoch} step {step} nll/token {float(sums.nll / sums.tokens):.3f} "
                    f"{tokens / (now - start):.0f} src+tgt tokens/s",
                    flush=True,
                )
            if now - last_snapshot >= args.snapshot_minutes * 60:
                snapshots = [*snapshots, {k: v.detach().clone() for k, v in model.state_dict().items()}]
                snapshots = snapshots[-args.average :]
                last_snapshot = now
            if now - start >= args.minutes * 60:
                break
        epoch += 1
    snapshots = [*snapshots, {k: v.detach().clone() for k, v in model.state_dict().items()}][-args.average :]
    averaged = {k: sum(s[k] for s in snapshots) / len(snapshots) for k in snapshots[0]}
    model.load_state_dict(averaged)
    save_model(args.out, model.eval(), config, corpus.tokenizer)
    print(f"{step} steps, {epoch} epochs; averaged {len(snapshots)} snapshots into {args.out}")


if __name__ == "__main__":
    main()
