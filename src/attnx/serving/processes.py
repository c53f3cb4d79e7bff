"""The processes of `attnx serve` around the service itself: the port checked before anything starts, a line
on standard error for each step of starting (checking the model, starting the workers, each worker loading and
warming up) and one once the service answers, SIGTERM and SIGINT turned into LitServe's orderly stop in the main
process, and the inference workers' clean exit within LitServe's grace period."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
import urllib.request
from collections.abc import Iterable
from typing import Any

EXIT_GRACE_S = 3.0
"""Seconds an inference worker told to stop has to exit cleanly before the kernel ends it. LitServe kills a worker
still alive 5 s after its SIGTERM with a warning (`Did not terminate gracefully. Killing (SIGKILL)`); on a busy
machine a worker's interpreter can take that long to tear down torch."""


def exit_quietly(signum: int, frame: object) -> None:
    """An inference worker's SIGTERM: exit through SystemExit, so that its resources are released, within
    [`EXIT_GRACE_S`][attnx.serving.processes.EXIT_GRACE_S] (a timer whose signal's default action ends the process
    guards the clean exit, without needing the interpreter to run)."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, EXIT_GRACE_S)
    sys.exit(0)


def say(message: str) -> None:
    """One progress line of `attnx serve` on standard error, from whichever of its processes does the work."""
    print(f"attnx serve: {message}", file=sys.stderr, flush=True)


def check_port_free(host: str, port: int) -> None:
    """An `OSError` naming the port when it cannot be listened on (before any worker starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(
                f"cannot listen on {host} port {port}: {err.strerror}; choose another --port"
            ) from None


def announce_when_ready(url: str, message: str, stop: threading.Event) -> threading.Thread:
    """Print `message` once `GET url/health` answers ok (the model is loaded and HTTP is up)."""

    key = os.environ.get("LIT_SERVER_API_KEY")  # LitServe then wants it on every route, /health included
    request = urllib.request.Request(f"{url}/health", headers={"X-API-Key": key} if key else {})

    def wait() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(request, timeout=1) as response:
                    if response.status == 200:
                        print(message, file=sys.stderr, flush=True)
                        return
            except OSError:
                pass
            stop.wait(0.1)

    thread = threading.Thread(target=wait, name="attnx-serve-ready", daemon=True)
    thread.start()
    return thread


class GracefulStop:
    """SIGTERM and SIGINT in the main process raise `KeyboardInterrupt` once, the way LitServe stops.

    LitServe answers a KeyboardInterrupt by letting the HTTP processes finish what they hold, then stopping
    the workers. A second signal during that shutdown is ignored rather than cutting it short. Processes
    forked from this one (which inherit the handler until they set their own) act on the signal as by default.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.stopping = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.stopping:
            return
        self.stopping = True
        print(
            f"attnx serve: {signal.Signals(signum).name} received; finishing requests in flight",
            file=sys.stderr,
            flush=True,
        )
        raise KeyboardInterrupt


def stop_processes(processes: Iterable[multiprocessing.process.BaseProcess]) -> None:
    """SIGTERM each process, newest first (LitServe's workers before the manager that hands them requests,
    so that none sees its manager go and reports it), then wait up to 5 s for each."""
    processes = sorted(processes, key=lambda process: process.pid or 0, reverse=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
