"""Request checks of the HTTP service: the body's shape, the limits, and the ASGI middleware applying them."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("litserve", reason="attnx serve needs the serve extra: pip install 'attnx[serve]'")

from attnx.inference.config import SearchConfig  # noqa: E402
from attnx.inference.phrases import PhraseConstraints  # noqa: E402
from attnx.serving.validation import (  # noqa: E402
    RequestError,
    RequestLimits,
    RequestLimitsMiddleware,
    parse_body,
    request_constraints,
    request_lines,
    request_search,
)
from tests.inference.test_phrases import FORMS  # noqa: E402
from tests.inference.test_translator import DECODED  # noqa: E402

LIMITS = RequestLimits(max_lines=3, max_line_chars=10, max_body_bytes=200)


def refusal(body: bytes) -> tuple[int, str]:
    with pytest.raises(RequestError) as err:
        parse_body(body, LIMITS)
    return err.value.status, err.value.message


def test_a_list_or_a_single_string_gives_the_lines():
    assert parse_body(b'{"text": ["A dog.", "", "Zwei."]}', LIMITS) == ["A dog.", "", "Zwei."]
    assert parse_body('{"text": "Grüße"}'.encode(), LIMITS) == ["Grüße"]
    assert request_lines({"text": ["x" * 10] * 3}, LIMITS) == ["x" * 10] * 3  # limits are inclusive


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"text": ', 400, "not valid JSON"),
        (b"\xff\xfe\x00", 400, "not UTF-8"),
        (b'["A dog."]', 422, "the body is a list"),
        (b'{"txt": ["A dog."]}', 422, 'unknown field "txt"'),
        (b'{"text": ["A dog."], "lang": "de"}', 422, 'unknown field "lang"'),
        (b"{}", 422, '"text" is missing'),
        (b'{"text": 5}', 422, '"text" is a number'),
        (b'{"text": null}', 422, '"text" is null'),
        (b'{"text": ["ok", {"a": 1}]}', 422, '"text" item 1 is an object'),
        (b'{"text": []}', 422, "empty list"),
        (b'{"text": ["a", "b", "c", "d"]}', 413, "4 lines; this server takes at most 3"),
        (b'{"text": ["short", "eleven char"]}', 413, "item 1 has 11 characters"),
        (b'{"text": "' + b"x" * 300 + b'"}', 413, "over 200 bytes"),
    ],
)
def test_each_bad_body_gets_its_status_and_a_message(body, status, words):
    got_status, message = refusal(body)
    assert got_status == status
    assert words in message and "\n" not in message


class Recorder:
    """An ASGI app that records what reached it, and answers 200."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, bytes]] = []

    async def __call__(self, scope, receive, send) -> None:
        message = await receive()
        self.calls.append((scope, message.get("body", b"")))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"passed"})


def call(app, body: bytes, *, path="/translate", method="POST", headers=(), chunk=None):
    """Run one HTTP request through ``app``: the status and body it answered."""
    chunk = chunk or max(1, len(body))
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)
    ]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers)}
    asyncio.run(app(scope, receive, send))
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body_out


def test_middleware_passes_a_good_body_on_as_json():
    inner = Recorder()
    app = RequestLimitsMiddleware(inner, path="/translate", limits=LIMITS)
    body = b'{"text": ["A dog."]}'
    form = [(b"content-type", b"application/x-www-form-urlencoded")]  # what curl -d declares
    assert call(app, body, headers=form, chunk=5) == (200, b"passed")
    scope, received = inner.calls[0]
    assert received == body  # reassembled from its chunks
    assert dict(scope["headers"])[b"content-type"] == b"application/json"


def test_middleware_refuses_bad_bodies_before_the_app():
    inner = Recorder()
    app = RequestLimitsMiddleware(inner, path="/translate", limits=LIMITS)
    status, body = call(app, b'{"txt": ["A dog."]}')
    assert status == 422 and "unknown field" in json.loads(body)["detail"]
    big = b"x" * 1000
    declared = [(b"content-length", b"1000")]
    assert call(app, big, headers=declared, chunk=100)[0] == 413  # by its Content-Length
    assert call(app, big, chunk=100)[0] == 413  # chunked, no Content-Length
    assert call(app, big, path="/other", chunk=100)[0] == 413  # the size limit holds on every route
    assert call(app, b"", headers=[(b"content-length", b"many")])[0] == 400
    assert inner.calls == []


def test_middleware_leaves_other_routes_and_gets_alone():
    inner = Recorder()
    app = RequestLimitsMiddleware(inner, path="/translate", limits=LIMITS)
    assert call(app, b"", method="GET", path="/health") == (200, b"passed")
    assert call(app, b"not json", path="/other") == (200, b"passed")
    assert len(inner.calls) == 2


SERVER_SEARCH = SearchConfig(beam=4)
CONSTRAINED = b'{"text": ["a", "b"], "constraints": %s}'
CONSTRAINED_ONE = b'{"text": ["a"], "constraints": %s}'
SAMPLING = b'{"text": "a", "search": {"sampling": true, %s}}'


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"text": "a", "search": 4}', 422, '"search" is a number; give an object'),
        (b'{"text": "a", "search": {"max_len_b": 500}}', 422, 'cannot set "max_len_b" per request'),
        (
            b'{"text": "a", "search": {"nbest": "4"}}',
            422,
            "search.nbest must be an integer, got '4' (a string)",
        ),
        (b'{"text": "a", "search": {"sampling": 1}}', 422, "search.sampling must be a boolean, got 1"),
        (b'{"text": "a", "search": {"top_k": 2.5}}', 422, "search.top_k must be an integer"),
        (b'{"text": "a", "search": {"alpha": true}}', 422, "search.alpha must be a number"),
        (b'{"text": "a", "search": {"nbest": 5}}', 422, "cannot exceed search.beam"),
        (b'{"text": "a", "search": {"sampling": true, "top_p": 1.5}}', 422, "top_p must be in (0, 1]"),
        (b'{"text": "a", "search": {"temperature": 0.5}}', 422, "only shape sampling"),
        (b'{"text": "a", "search": {"beam": 40}}', 413, "at most 16"),
        (b'{"text": "a", "scores": "yes"}', 422, '"scores" is a string; give true or false'),
        # values that passed these checks and failed the batch they joined (tests/serving/test_server.py)
        (
            SAMPLING % b'"temperature": 1e-300',
            422,
            "search.temperature must be from 0.001 to 1000, got 1e-300",
        ),
        (
            SAMPLING % b'"temperature": 1e+300',
            422,
            "search.temperature must be from 0.001 to 1000, got 1e+300",
        ),
        (b'{"text": "a", "search": {"alpha": 1e+308}}', 422, "search.alpha must be from -5 to 5, got 1e+308"),
        (b'{"text": "a", "search": {"alpha": NaN}}', 422, "search.alpha must be from -5 to 5, got nan"),
        (
            b'{"text": "a", "search": {"alpha": -Infinity}}',
            422,
            "search.alpha must be from -5 to 5, got -inf",
        ),
        (SAMPLING % b'"seed": 1208925819614629174706176', 422, "search.seed must be from 0 to 2**64 - 1"),
        (SAMPLING % b'"seed": -1', 422, "search.seed must be from 0 to 2**64 - 1"),
        (SAMPLING % b'"beam": 8', 422, "search.beam (8) is not used by sampling"),
    ],
)
def test_a_request_s_search_settings_are_checked_in_one_line(body, status, words):
    with pytest.raises(RequestError) as err:
        parse_body(body, LIMITS, SERVER_SEARCH)
    assert err.value.status == status and words in err.value.message, err.value.message
    assert "\n" not in err.value.message


@pytest.mark.parametrize(
    ("body", "server", "words"),
    [
        (b'{"text": "a", "search": {"nbest": 5}}', SearchConfig(beam=4), "to at least 5"),
        (
            b'{"text": "a", "search": {"beam": 2}}',
            SearchConfig(mbr=4, mbr_candidates="nbest"),
            "to at least 4",
        ),
        (CONSTRAINED_ONE % b'[["a", "b", "c", "d"]]', SearchConfig(beam=4), "to 5 or give fewer phrases"),
    ],
    ids=["nbest over the beam", "mbr over the beam", "phrases over the beam"],
)
def test_a_refusal_names_the_request_field_to_raise_not_the_command_line_option(body, server, words):
    """A client changes the beam in its request's "search", it has no `--search.beam`: the 422 names that
    field, where the same refusal on the command line names the option."""
    with pytest.raises(RequestError) as err:
        parse_body(body, RequestLimits(max_body_bytes=1000), server)
    message = err.value.message
    assert err.value.status == 422, message
    assert f'raise "beam" in the request\'s "search" {words}' in message and "--search" not in message, (
        message
    )


def test_a_request_may_change_the_settings_it_is_allowed_to():
    payload = {"text": "a", "search": {"nbest": 2, "alpha": 1, "seed": None}, "scores": True}
    assert request_search(payload, SERVER_SEARCH, LIMITS) == {"nbest": 2, "alpha": 1, "seed": None}
    assert request_search({"text": "a"}, SERVER_SEARCH, LIMITS) == {}
    sampled = {"text": "a", "search": {"sampling": True, "nbest": 16, "temperature": 0.7, "seed": 3}}
    assert request_search(sampled, SERVER_SEARCH, LIMITS)["nbest"] == 16


def test_a_request_that_samples_is_served_by_a_server_of_another_beam():
    """Sampling uses no beam and `SearchConfig` refuses one beside it: a server of beam 2 still serves samples
    (`changed_search`), and a request naming a beam beside sampling is refused."""
    server = SearchConfig(beam=2)
    assert parse_body(b'{"text": "a", "search": {"sampling": true, "nbest": 3}}', LIMITS, server) == ["a"]
    with pytest.raises(RequestError, match=r"search.beam \(2\) is not used by sampling"):
        parse_body(b'{"text": "a", "search": {"sampling": true, "beam": 2}}', LIMITS, server)


# --- terminology constraints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (CONSTRAINED % b'[{"include": ["x"]}]', '"constraints" has 1 items for 2 lines'),
        (CONSTRAINED % b'{"include": ["x"]}', '"constraints" has an object items for 2 lines'),
        (CONSTRAINED % b'[{"include": [""]}, null]', '"constraints" item 0: an empty phrase in "include"'),
        (CONSTRAINED % b'[null, {"include": "x"}]', '"constraints" item 1: "include" must be a list'),
        (CONSTRAINED % b'[null, {"ordered": 1}]', '"ordered" must be true or false'),
        (CONSTRAINED % b'[null, {"must": ["x"]}]', "unknown constraint key 'must'"),
        (
            CONSTRAINED % b'[["a", "b", "c", "d"], null]',
            "item 0: 4 phrases to include need a beam of at least 5",
        ),
        (
            b'{"text": "a", "constraints": ["x"], "search": {"sampling": true}}',
            "item 0: phrases to include need beam search",
        ),
    ],
)
def test_a_request_s_constraints_are_checked_in_one_line(body, words):
    with pytest.raises(RequestError) as err:
        parse_body(body, RequestLimits(max_body_bytes=1000), SearchConfig(beam=4))
    assert err.value.status == 422 and words in err.value.message, err.value.message
    assert "\n" not in err.value.message


def test_a_request_may_give_each_line_its_constraints():
    body = b'{"text": ["a", "b"], "constraints": [{"include": ["x"], "exclude": ["y"]}, null]}'
    assert parse_body(body, RequestLimits(max_body_bytes=1000), SearchConfig(beam=4)) == ["a", "b"]
    assert parse_body(b'{"text": "a", "constraints": ["x", "z"]}', LIMITS, SearchConfig(beam=4)) == ["a"]


@pytest.mark.parametrize("form", FORMS)
def test_a_request_s_constraints_take_every_form_of_a_constraints_file(form):
    """A string item is read as a line of `attnx translate --constraints`; an object, an array or null as the
    JSON it is. Either way the line gets what the file's line gives."""
    line, expected = FORMS[form]
    for item in [line, *([DECODED[form]] if form in DECODED else [])]:
        for payload in (
            {"text": ["a line", "b"], "constraints": [item, None]},
            {"text": "a line", "constraints": item},  # one line: its value alone
        ):
            body = json.dumps(payload).encode("utf-8")
            assert parse_body(body, RequestLimits(max_body_bytes=1000), SearchConfig(beam=4))
            got = request_constraints(json.loads(body), SearchConfig(beam=4))  # None: no line has any
            assert (got[0] if got is not None else PhraseConstraints()) == expected, (item, got)
