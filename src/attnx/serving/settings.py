"""What `attnx serve` can be told: where to listen and decode (`ServeSettings`) and how much one request may
ask for (`RequestLimits`). Plain settings, importable without LitServe: the command reads its defaults here."""

from __future__ import annotations

from dataclasses import dataclass

from attnx.errors import ConfigError
from attnx.inference.config import AUTO, DEFAULT_MAX_TOKENS, check_precision

HOSTS = ("127.0.0.1", "0.0.0.0", "::")
"""Interfaces LitServe binds to: loopback only (the default), every IPv4 interface, every interface."""


@dataclass(frozen=True)
class RequestLimits:
    """How much one request may ask for."""

    max_lines: int = 64
    """Lines (segments) per request."""
    max_line_chars: int = 2000
    """Characters per line."""
    max_body_bytes: int = 1_000_000
    """Bytes of the request body."""
    max_beam: int = 16
    """Beam size, or hypotheses (n-best, samples) per line, a request's `"search"` may ask for."""

    def __post_init__(self) -> None:
        for name in ("max_lines", "max_line_chars", "max_body_bytes", "max_beam"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` needs besides the model and how to decode."""

    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "cpu"
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_batch_size: int = 32
    batch_timeout: float = 0.01
    timeout: float = 30.0
    workers: int = 1
    threads: int = 0
    precision: str = AUTO
    """What a checkpoint decodes in, or an export's compute type, as attnx translate's; `auto` is resolved once,
    in the serving process, before the workers start."""
    compute_type: str | None = None
    """An export's CTranslate2 compute type, once `auto` is resolved (None: the one `precision` names)."""
    limits: RequestLimits = RequestLimits()

    def __post_init__(self) -> None:
        if self.host not in HOSTS:
            raise ConfigError(
                f"--host {self.host}: LitServe binds only to {', '.join(HOSTS)} "
                "(127.0.0.1: this machine only; 0.0.0.0 or ::: every interface)"
            )
        if not 1024 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: choose a port from 1024 to 65535")
        for name in ("max_tokens", "max_batch_size", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise ConfigError(f"--threads must be 0 (torch's default) or more, got {self.threads}")
        if self.timeout <= 0:
            raise ConfigError(f"--timeout must be positive, got {self.timeout}")
        check_precision(self.precision, self.device.split(":")[0])
        if not 0 <= self.batch_timeout < self.timeout:
            raise ConfigError(
                f"--batch_timeout {self.batch_timeout} must be at least 0 and below --timeout {self.timeout}"
            )

    @property
    def url(self) -> str:
        """Where a client on this machine reaches the service."""
        local = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        return f"http://{local}:{self.port}"
