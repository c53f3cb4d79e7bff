"""What a translation request may look like, checked before it reaches the model.

A request body is `{"text": ["line", ...]}` (or `{"text": "one line"}`), optionally with `"search": {...}`
(some of the server's search settings changed for this request: `nbest`, `sampling`, `top_k`, ...; see
[`REQUEST_SEARCH`][attnx.serving.validation.REQUEST_SEARCH]), `"scores": true` (answer every hypothesis
with its scores) and `"constraints"`: per line, terminology constraints, read as `attnx translate
--constraints` reads a line of its file ([`phrases`][attnx.inference.phrases]):
`{"include": [...], "exclude": [...], "ordered": false}`, a list of phrases to include, null, or a string
(any form of a file's line, such as tab-separated phrases to include); one value alone for a `"text"`
string. Every check runs in the HTTP process, so a bad request is answered at once with a 4xx and
`{"detail": "<message>"}` and never joins a batch of good ones: one request's mistake cannot fail its
neighbours' translations. (A request that still fails while decoding is isolated by the worker:
`attnx.serving.server.TranslationAPI.predict`.)

| problem                                             | status |
|-----------------------------------------------------|--------|
| body over `max_body_bytes`                        | 413    |
| body that is not JSON (or not UTF-8)                | 400    |
| not an object, a field other than `text`, `search`, `scores`, `constraints`; `text` missing or not a string / list of strings | 422 |
| `text` an empty list                              | 422    |
| `search` not an object, a setting a request may not change, a value the search refuses (type or range, as `attnx translate` refuses it: `SearchConfig`'s own checks, a setting to change named as the request sets it); `scores` not a boolean | 422 |
| `search.beam` or `search.nbest` over `max_beam`   | 413    |
| `constraints` not one per line, malformed, an empty phrase, more phrases to include than the beam holds, phrases to include beside sampling | 422 |
| more than `max_lines` lines, a line over `max_line_chars` characters | 413 |
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attnx.inference.config import SearchConfig, changed_search, worded
from attnx.inference.lexical import PhraseIds
from attnx.inference.phrases import PhraseConstraints, check_phrases, read_constraint
from attnx.serving.settings import RequestLimits

FIELD = "text"
SEARCH = "search"
SCORES = "scores"
CONSTRAINTS = "constraints"
REQUEST_SEARCH = (
    "beam",
    "nbest",
    "alpha",
    "sampling",
    "top_k",
    "top_p",
    "temperature",
    "seed",
    "no_repeat_ngram",
    "min_length",
)
"""Search settings one request may change (`"search": {"nbest": 4}`); the rest stay the server's."""
DRAIN_BYTES = 100_000_000
"""Bytes of a refused body read and dropped before answering 413; a client sending more sees the connection
closed instead."""
EXAMPLE = '{"text": ["a line", ...]}'


def request_option(setting: str) -> str:
    """A search setting as a client sets it, `"beam" in the request's "search"`: what a refusal sent over HTTP
    asks to change (a client has no `--search.beam` to raise)."""
    return f'"{setting}" in the request\'s "{SEARCH}"'


class RequestError(Exception):
    """A request the server refuses: an HTTP status and a one-line message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    if type(value) in names:
        return names[type(value)]
    return "a number"


def request_lines(payload: Any, limits: RequestLimits) -> list[str]:
    """The lines of a decoded request body, or a `RequestError` saying what is wrong with it."""
    if not isinstance(payload, dict):
        raise RequestError(422, f"the body is {json_type(payload)}; send a JSON object {EXAMPLE}")
    unknown = sorted(set(payload) - {FIELD, SEARCH, SCORES, CONSTRAINTS})
    if unknown:
        raise RequestError(422, f"unknown field {', '.join(map(json.dumps, unknown))}; the body is {EXAMPLE}")
    if FIELD not in payload:
        raise RequestError(422, f'the field "text" is missing; the body is {EXAMPLE}')
    text = payload[FIELD]
    if isinstance(text, str):
        lines = [text]
    elif isinstance(text, list):
        lines = text
        for i, line in enumerate(lines):
            if not isinstance(line, str):
                raise RequestError(422, f'"text" item {i} is {json_type(line)}; every line must be a string')
    else:
        raise RequestError(422, f'"text" is {json_type(text)}; give a string or a list of strings')
    if not lines:
        raise RequestError(422, '"text" is an empty list; give at least one line')
    if len(lines) > limits.max_lines:
        raise RequestError(
            413,
            f'"text" has {len(lines)} lines; this server takes at most {limits.max_lines} per request '
            "(split them over several requests)",
        )
    for i, line in enumerate(lines):
        if len(line) > limits.max_line_chars:
            raise RequestError(
                413,
                f'"text" item {i} has {len(line)} characters; this server takes at most '
                f"{limits.max_line_chars} per line (split the text into sentences)",
            )
    return lines


def request_search(payload: dict[str, Any], search: SearchConfig, limits: RequestLimits) -> dict[str, Any]:
    """The search settings a decoded request changes (`{}` for none), checked against `search` (the server's)
    and `limits`, or a `RequestError`."""
    if SCORES in payload and not isinstance(payload[SCORES], bool):
        raise RequestError(422, f'"scores" is {json_type(payload[SCORES])}; give true or false')
    changes = payload.get(SEARCH, {})
    if not isinstance(changes, dict):
        raise RequestError(422, f'"search" is {json_type(changes)}; give an object such as {{"nbest": 4}}')
    unknown = sorted(set(changes) - set(REQUEST_SEARCH))
    if unknown:
        raise RequestError(
            422,
            f'"search" cannot set {", ".join(map(json.dumps, unknown))} per request; it may set '
            + ", ".join(REQUEST_SEARCH),
        )
    try:  # types and ranges: SearchConfig's checks, the same as attnx translate's
        asked = changed_search(search, **changes)
    except ValueError as err:
        raise RequestError(422, f'"search": {worded(err, request_option)}') from None
    width = max(asked.nbest, 1 if asked.sampling else asked.beam)
    if width > limits.max_beam:
        raise RequestError(
            413, f'"search" asks for {width} hypotheses per line; this server takes at most {limits.max_beam}'
        )
    request_constraints(payload, asked)
    return changes


def request_constraints(payload: dict[str, Any], search: SearchConfig) -> list[PhraseConstraints] | None:
    """The request's constraints, one per line (None: none), checked as far as the text allows (the pieces
    each phrase takes, and a phrase `no_repeat_ngram` forbids, are the model's worker's to refuse), or a
    `RequestError`."""
    if CONSTRAINTS not in payload or payload[CONSTRAINTS] is None:
        return None
    given = payload[CONSTRAINTS]
    text = payload[FIELD]
    items = [given] if isinstance(text, str) else given
    if not isinstance(text, str) and (not isinstance(given, list) or len(given) != len(text)):
        count = len(given) if isinstance(given, list) else json_type(given)
        raise RequestError(
            422,
            f'"constraints" has {count} items for {len(text)} lines of "text": give one per line (null: none)',
        )
    try:
        out = [read_constraint(c, f'"constraints" item {i}') for i, c in enumerate(items)]
        ids = [PhraseIds([[0]] * len(c.include)) for c in out]  # the count; lengths are the worker's
        check_phrases(
            ids, [[0]] * len(ids), None, dataclasses.replace(search, max_len_b=2**31), where(len(ids))
        )
    except ValueError as err:
        raise RequestError(422, worded(err, request_option)) from None
    return out


def where(n: int) -> list[str]:
    return [f'"constraints" item {i}' for i in range(n)]


def parse_body(body: bytes, limits: RequestLimits, search: SearchConfig | None = None) -> list[str]:
    """The lines of a raw request body (JSON in UTF-8), or a `RequestError`; with `search` (the server's
    settings), the request's `"search"` and `"scores"` are checked too."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, body_too_large(limits))
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the body is not UTF-8 (byte {err.start}); send JSON in UTF-8") from None
    except json.JSONDecodeError as err:
        raise RequestError(
            400,
            f"the body is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); send {EXAMPLE}",
        ) from None
    lines = request_lines(payload, limits)
    if search is not None:
        request_search(payload, search, limits)
    return lines


def body_too_large(limits: RequestLimits) -> str:
    return f"the body is over {limits.max_body_bytes} bytes, this server's limit; send fewer or shorter lines"


class RequestLimitsMiddleware:
    """ASGI middleware: refuse oversized bodies on every route and bad bodies on `POST path`.

    A body that passes is handed on unchanged (as `application/json`, whatever content type the client
    declared, so `curl -d` works); anything else is answered here with `{"detail": message}`.
    """

    def __init__(
        self, app: ASGIApp, *, path: str, limits: RequestLimits, search: SearchConfig | None = None
    ) -> None:
        self.app = app
        self.path = path
        self.limits = limits
        self.search = search

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        try:
            declared = self.content_length(scope)
            if declared is not None and declared > self.limits.max_body_bytes:
                await self.drain(receive)
                raise RequestError(413, body_too_large(self.limits))
            body = await self.read_body(receive)
            if scope["path"] == self.path and scope["method"] == "POST":
                parse_body(body, self.limits, self.search)
        except RequestError as err:
            await self.refuse(send, err)
            return
        if scope["path"] == self.path:
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, self.replay(body, receive), send)

    @staticmethod
    def content_length(scope: Scope) -> int | None:
        for key, value in scope["headers"]:
            if key.lower() == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    raise RequestError(400, "the Content-Length header is not a number") from None
        return None

    async def read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:  # no or a false Content-Length
                if message.get("more_body", False):
                    await self.drain(receive)
                raise RequestError(413, body_too_large(self.limits))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    async def drain(receive: Receive) -> None:
        """Read and drop the rest of a refused body (up to `DRAIN_BYTES`), so that a client still
        sending it reads the 413 instead of a reset connection."""
        drained = 0
        while drained <= DRAIN_BYTES:
            message = await receive()
            drained += len(message.get("body", b""))
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return

    @staticmethod
    def replay(body: bytes, receive: Receive) -> Receive:
        sent = False

        async def replayed() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the client's disconnect

        return replayed

    @staticmethod
    async def refuse(send: Send, err: RequestError) -> None:
        content = json.dumps({"detail": err.message}, ensure_ascii=False).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": err.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(content)).encode("ascii")),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})
