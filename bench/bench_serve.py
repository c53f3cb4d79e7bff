"""Serving speed: requests/s and latency of ``attnx serve`` at 1, 8 and 32 concurrent clients on loopback.

    python bench/bench_serve.py [--model CKPT] [--data DIR] [--clients 1 8 32] [--requests 200]
        [--seconds 60] [--lines 1] [--max_batch_sizes 32] [--batch_timeout 0.01] [--threads 1]
        [--beam 4] [--max_len_b 50]

The server is the real command (``python -m attnx serve``) in its own processes; the clients are threads of
this process sending ``POST /translate`` over loopback with urllib, each request ``--lines`` English
sentences of Multi30k test_2016_flickr taken in turn. Every client sends its next request as soon as the
previous one is answered (a closed loop), so the offered load grows with the number of clients. Each level
stops after ``--requests`` answered requests or ``--seconds``, whichever comes first, after a warm-up of
one request per client. Latency is from sending the request to reading the whole answer; p50 and p99 are
nearest-rank percentiles. Lines/s counts source sentences translated.

Without ``--model`` the model is a tiny random one (2+2 layers, d_model 32, a 200-piece BPE over 600
Multi30k sentences), written to a temporary directory: it measures the service's own overhead
(HTTP, queues, batching) more than translation. Clients and server share the machine's cores; results go to
stdout as Markdown with the CPU model, for docs/serve.md. The server's worker runs one torch thread by
default: on cores busy with other work, torch threads that wait for each other can make decoding a hundred
times slower.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO, add_data_option, machine, machine_line, multi30k, multi30k_tokenizer


def tiny_checkpoint(data: Path, directory: Path) -> Path:
    """A tiny random model (2+2 layers, d_model 32) with a BPE over 300 English + 300 German Multi30k sentences."""
    import torch

    from attnx.checkpoint import save_model
    from attnx.model import TransformerConfig, build_transformer

    tokenizer = multi30k_tokenizer(data, 200, per_side=300)
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_len=64,
    )
    path = directory / "tiny.ckpt"
    save_model(path, build_transformer(config), config, tokenizer)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``attnx serve`` in a subprocess, up once ``/health`` says ok."""

    def __init__(self, argv: list[str], threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": str(threads)}
        self.command = [sys.executable, "-m", "attnx", "serve", "--port", str(self.port), *argv]
        self.process = subprocess.Popen(self.command, env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(
                    f"attnx serve exited with {self.process.returncode}: {' '.join(self.command)}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise SystemExit("attnx serve did not become ready within 300 s")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


@dataclass
class Level:
    clients: int
    latencies: list[float] = field(default_factory=list)
    lines: int = 0
    errors: int = 0
    seconds: float = 0.0

    def percentile_ms(self, p: float) -> str:
        """Nearest-rank percentile of the latencies, in milliseconds."""
        if not self.latencies:
            return "-"
        ordered = sorted(self.latencies)
        return f"{1000 * ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]:.0f}"


def post(url: str, lines: list[str]) -> int:
    """Send one request; the number of translations it got back (0 on an error)."""
    request = urllib.request.Request(
        url + "/translate",
        data=json.dumps({"text": lines}).encode("utf-8"),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return len(json.loads(response.read())["translations"])
    except (OSError, urllib.error.HTTPError, ValueError, KeyError):
        return 0


def measure(url: str, sentences: list[str], clients: int, lines: int, requests: int, seconds: float) -> Level:
    level = Level(clients)
    lock = threading.Lock()
    next_sentence = [0]
    sent = [0]

    def batch() -> list[str]:
        with lock:
            start = next_sentence[0]
            next_sentence[0] += lines
        return [sentences[(start + i) % len(sentences)] for i in range(lines)]

    # warm-up: one request per client, not counted
    warm = [threading.Thread(target=post, args=(url, batch())) for _ in range(clients)]
    for thread in warm:
        thread.start()
    for thread in warm:
        thread.join()

    deadline = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < deadline:
            with lock:
                if sent[0] >= requests:
                    return
                sent[0] += 1
            request = batch()
            start = time.perf_counter()
            got = post(url, request)
            elapsed = time.perf_counter() - start
            with lock:
                if got == len(request):
                    level.latencies.append(elapsed)
                    level.lines += got
                else:
                    level.errors += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    level.seconds = time.perf_counter() - start
    return level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="checkpoint to serve (default: a tiny random model)")
    add_data_option(parser)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=200, help="answered requests per level at most")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per level at most")
    parser.add_argument("--lines", type=int, default=1, help="sentences per request")
    parser.add_argument("--max_batch_sizes", type=int, nargs="+", default=[32])
    parser.add_argument("--batch_timeout", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server's worker")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max_len_b", type=int, default=50)
    args = parser.parse_args()

    sentences = multi30k(args.data, "test_2016_flickr", "en")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or tiny_checkpoint(args.data, Path(tmp))
        print(
            f"{machine_line(machine(with_torch=False))}; the server's worker on {args.threads} torch "
            "thread(s); clients and server on the same machine"
        )
        print(
            f"model: {args.model or 'tiny random (2+2 layers, d_model 32)'}; {args.lines} sentence(s) a request"
        )
        print(f"command: python {' '.join(sys.argv)}\n")
        print("| max_batch_size | clients | requests | requests/s | sentences/s | p50 ms | p99 ms | errors |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for max_batch_size in args.max_batch_sizes:
            server = Server(
                [
                    *("--model", str(model), "--threads", str(args.threads)),
                    *("--search.beam", str(args.beam), "--search.max_len_b", str(args.max_len_b)),
                    *("--max_batch_size", str(max_batch_size), "--batch_timeout", str(args.batch_timeout)),
                ],
                args.threads,
            )
            try:
                for clients in args.clients:
                    level = measure(server.url, sentences, clients, args.lines, args.requests, args.seconds)
                    done = len(level.latencies)
                    print(
                        f"| {max_batch_size} | {clients} | {done} | {done / level.seconds:.1f} | "
                        f"{level.lines / level.seconds:.1f} | {level.percentile_ms(50)} | "
                        f"{level.percentile_ms(99)} | {level.errors} |",
                        flush=True,
                    )
            finally:
                status = server.stop()
            if status != 0:
                raise SystemExit(f"attnx serve exited with {status} after SIGTERM")
        print(f"\nserver: {' '.join(server.command[1:])}")


if __name__ == "__main__":
    main()
