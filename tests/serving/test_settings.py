"""What `attnx serve` can be told: settings LitServe cannot honour and request limits below 1 are refused in one
line naming the option; the address a client uses. Importable, and tested, without LitServe."""

from __future__ import annotations

import pytest

from attnx.inference.config import DEFAULT_MAX_TOKENS
from attnx.serving.settings import HOSTS, RequestLimits, ServeSettings


def test_settings_refuse_what_litserve_cannot_do():
    for bad, words in [
        (dict(host="localhost"), "--host localhost"),
        (dict(port=80), "--port 80"),
        (dict(workers=0), "--workers must be at least 1"),
        (dict(batch_timeout=40.0), "below --timeout"),
    ]:
        with pytest.raises(ValueError, match=words):
            ServeSettings(**bad)
    assert ServeSettings(host="::", port=9000).url == "http://[::1]:9000"


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="--max_lines must be at least 1"):
        RequestLimits(max_lines=0)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(port=65536), r"^--port 65536: choose a port from 1024 to 65535$"),
        (dict(max_tokens=0), r"^--max_tokens must be at least 1, got 0$"),
        (dict(max_batch_size=0), r"^--max_batch_size must be at least 1, got 0$"),
        (dict(threads=-1), r"^--threads must be 0 \(torch's default\) or more, got -1$"),
        (dict(timeout=0.0), r"^--timeout must be positive, got 0.0$"),
        (dict(batch_timeout=-0.1), r"^--batch_timeout -0.1 must be at least 0 and below --timeout 30.0$"),
        (dict(precision="16-mixed"), r"^precision 16-mixed decodes on CUDA devices; on a CPU choose "),
    ],
)
def test_every_refusal_is_one_line_naming_the_option(bad, message):
    with pytest.raises(ValueError, match=message):
        ServeSettings(**bad)


def test_defaults_listen_on_this_machine_only_and_decode_as_every_engine():
    settings = ServeSettings()
    assert (settings.host, settings.port, settings.url) == ("127.0.0.1", 8000, "http://127.0.0.1:8000")
    assert settings.max_tokens == DEFAULT_MAX_TOKENS and settings.limits == RequestLimits()
    assert HOSTS == ("127.0.0.1", "0.0.0.0", "::")
    assert ServeSettings(host="0.0.0.0", port=9000).url == "http://127.0.0.1:9000"  # a client on this machine


@pytest.mark.parametrize("name", ["max_lines", "max_line_chars", "max_body_bytes", "max_beam"])
def test_each_request_limit_must_be_positive(name):
    with pytest.raises(ValueError, match=rf"^--{name} must be at least 1, got 0$"):
        RequestLimits(**{name: 0})
    assert getattr(RequestLimits(**{name: 1}), name) == 1
