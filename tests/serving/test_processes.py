"""The processes around the service: the port checked, the ready line, signals and the workers' exit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from attnx.serving.processes import EXIT_GRACE_S, GracefulStop, announce_when_ready, check_port_free


def test_a_busy_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1 port {port}"):
            check_port_free("127.0.0.1", port)


def test_the_ready_line_waits_for_health_and_sends_litserves_api_key(monkeypatch, capsys):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            ok = self.headers.get("X-API-Key") == "sekret"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"Not authenticated")

        def log_message(self, *args):
            pass

    monkeypatch.setenv("LIT_SERVER_API_KEY", "sekret")
    with ThreadingHTTPServer(("127.0.0.1", 0), Health) as http:
        threading.Thread(target=http.serve_forever, daemon=True).start()
        stop = threading.Event()
        waiter = announce_when_ready(f"http://127.0.0.1:{http.server_address[1]}", "up and running", stop)
        waiter.join(timeout=300)
        http.shutdown()
    stop.set()
    assert not waiter.is_alive() and capsys.readouterr().err == "up and running\n"


def test_a_worker_told_to_stop_exits_before_litserve_would_kill_it_even_where_its_exit_hangs():
    """A worker's clean exit that does not end (here an exit handler that sleeps a minute) is ended by the
    kernel after EXIT_GRACE_S, before LitServe's 5 s, after which it SIGKILLs the worker with a warning."""
    assert EXIT_GRACE_S < 5
    script = (
        "import atexit, os, signal, time\n"
        "from attnx.serving.processes import exit_quietly\n"
        "atexit.register(time.sleep, 60)\n"
        "signal.signal(signal.SIGTERM, exit_quietly)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(60)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGALRM, done.stderr
    assert done.stderr == ""


def test_the_first_signal_interrupts_and_a_second_is_ignored():
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop() as stop:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at once; this is never waited out
        os.kill(os.getpid(), signal.SIGINT)  # ignored: shutdown is under way
        assert stop.stopping
    assert signal.getsignal(signal.SIGTERM) == before
