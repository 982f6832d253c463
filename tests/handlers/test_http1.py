"""The webhook client's HTTP/1.1 codec: the request's bytes, and the answer's reader.

The reader is checked against h11 (the parser it replaced, and what hypercorn and httpx
use): on generated answers, in every split into packets, both must read the same status,
headers, body and keep-alive verdict; on mutated bytes, whatever both read, they read alike,
and ours never fails with anything but :class:`MalformedAnswer`. The few deliberate
differences are tests of their own below.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.handlers.http1 import (
    HEAD_BYTES_MAX,
    MalformedAnswer,
    ResponseReader,
    encode_request,
)

BIG = 1 << 30


def read(data: bytes | list[bytes], body_max: int = BIG) -> ResponseReader:
    """Feed ``data`` (or its pieces), then EOF if the answer is not complete by then."""
    reader = ResponseReader(body_max)
    for piece in [data] if isinstance(data, bytes) else data:
        if reader.feed(piece):
            return reader
    reader.feed(b"")
    return reader


class H11Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, reusable: bool):
        self.status, self.headers, self.body, self.reusable = status, headers, body, reusable


def read_with_h11(pieces: list[bytes]) -> H11Answer:
    """How h11 reads the same bytes as the answer to a POST (the client's code before)."""
    parser = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_BYTES_MAX)
    request = [("Host", "x"), ("Content-Length", "0")]
    parser.send(h11.Request(method="POST", target="/", headers=request))
    parser.send(h11.EndOfMessage())
    queue = [*pieces, b""]
    status, headers, body = 0, {}, bytearray()
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            if not queue:
                raise h11.RemoteProtocolError("no more data")
            parser.receive_data(queue.pop(0))
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {n.decode("ascii"): v.decode("latin-1") for n, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise h11.RemoteProtocolError("closed")
    reusable = parser.our_state is h11.DONE and parser.their_state is h11.DONE
    return H11Answer(status, headers, bytes(body), reusable)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return [p for p in pieces if p]


# --- the request -------------------------------------------------------------------------------


def test_a_request_is_a_post_with_its_headers_and_length() -> None:
    data = encode_request(b"/hook?a=1", [("Host", "example.com"), ("X-A", "b c")], b"{}")
    assert data == (
        b"POST /hook?a=1 HTTP/1.1\r\nHost: example.com\r\nX-A: b c\r\nContent-Length: 2\r\n\r\n{}"
    )


def test_h11_reads_the_request_as_it_was_meant() -> None:
    server = h11.Connection(h11.SERVER)
    server.receive_data(encode_request(b"/p", [("Host", "h"), ("A", "\tb")], b"hello"))
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target) == (b"POST", b"/p")
    assert (b"content-length", b"5") in request.headers
    data = server.next_event()
    assert isinstance(data, h11.Data)
    assert data.data == b"hello"
    assert isinstance(server.next_event(), h11.EndOfMessage)


@pytest.mark.parametrize(
    ("name", "value"),
    [("X", "a\r\nInjected: 1"), ("X", "a\nb"), ("X", "nul\0"), ("X", "é"), ("Bad Name", "v"),
     ("X:Y", "v"), ("", "v")],
)  # fmt: skip
def test_no_header_can_split_the_head(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="header"):
        encode_request(b"/", [("Host", "h"), (name, value)], b"")


@pytest.mark.parametrize("target", [b"", b"/a b", b"/\r\n", b"http://x/", "/é".encode()])
def test_a_target_must_be_a_path(target: bytes) -> None:
    with pytest.raises(ValueError, match="target"):
        encode_request(target, [("Host", "h")], b"")


# --- answers, one by one -------------------------------------------------------------------


def test_an_answer_in_one_piece() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Y:  z \r\n\r\nok")
    assert (reader.status, reader.headers, reader.body, reader.reusable) == (
        200, {"content-length": "2", "x-y": "z"}, b"ok", True
    )  # fmt: skip


def test_an_answer_a_byte_at_a_time() -> None:
    data = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n"
    )
    reader = read([data[i : i + 1] for i in range(len(data))])
    assert (reader.status, reader.body, reader.reusable) == (201, b"abc", True)


def test_interim_answers_are_skipped() -> None:
    reader = read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Hints\r\nLink: x\r\n\r\n"
                  b"HTTP/1.1 204 No Content\r\n\r\n")  # fmt: skip
    assert (reader.status, reader.headers, reader.reusable) == (204, {}, True)


def test_an_answer_without_length_runs_until_the_close() -> None:
    reader = ResponseReader(BIG)
    assert not reader.feed(b"HTTP/1.1 500 Oops\r\n\r\npart one, ")
    assert not reader.feed(b"part two")
    assert reader.feed(b"")
    assert (reader.status, reader.body, reader.reusable) == (500, b"part one, part two", False)


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n",
     b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
     # Both framings (a request-smuggling shape): read as chunked, then not trusted again.
     b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"],
)  # fmt: skip
def test_answers_after_which_the_connection_is_not_kept(head: bytes) -> None:
    reader = read(head)
    assert reader.status == 200
    assert not reader.reusable


def test_bytes_after_the_answer_make_the_connection_unusable() -> None:
    """h11 would keep them and read them as the next request's answer."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    assert not read(answer + second).reusable
    reader = ResponseReader(BIG)
    assert reader.feed(answer)
    assert reader.reusable
    assert reader.feed(second)
    assert not reader.reusable


def test_a_body_over_the_cap_is_not_read_to_its_end() -> None:
    reader = ResponseReader(5)
    assert reader.feed(b"HTTP/1.1 400 Bad\r\nContent-Length: 100\r\n\r\n0123456789")
    assert (reader.status, reader.body, reader.reusable) == (400, b"01234", False)
    chunked = ResponseReader(5)
    assert not chunked.feed(b"HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    assert chunked.feed(b"3\r\ndef\r\n0\r\n\r\n")
    assert (chunked.body, chunked.reusable) == (b"abcde", False)


def test_a_body_exactly_at_the_cap_keeps_the_connection() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabcde", body_max=5)
    assert (reader.body, reader.reusable) == (b"abcde", True)


@pytest.mark.parametrize(
    ("data", "said"),
    [(b"", "before answering"),
     (b"HTTP/1.1 200 OK\r\nContent-", "in the middle"),
     (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "in the middle"),
     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "in the middle"),
     (b"SMTP ready\r\n\r\n", "status line"),
     (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
     (b"HTTP/1.1 099 Odd\r\n\r\n", "not an HTTP status"),
     (b"HTTP/1.1 101 Switching\r\nUpgrade: h2c\r\n\r\n", "switched"),
     (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n", "Content-Length"),
     (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
     (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", "Content-Length"),
     (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "conflicting"),
     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "Transfer-Encoding"),
     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
      "Transfer-Encoding"),
     (b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", "malformed header"),
     (b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n", "malformed header"),
     (b"HTTP/1.1 200 OK\r\n folded\r\n\r\n", "continuation"),
     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk-size"),
     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", "CRLF"),
     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n", "chunk-size")],
)  # fmt: skip
def test_malformed_or_cut_answers_are_refused_with_a_reason(data: bytes, said: str) -> None:
    with pytest.raises(MalformedAnswer, match=said):
        read(data)


def test_a_head_past_its_limit_is_refused_even_unfinished() -> None:
    reader = ResponseReader(BIG, head_max_bytes=100)
    with pytest.raises(MalformedAnswer, match="over 100 bytes"):
        reader.feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 200)


def test_a_trickled_head_costs_linear_work() -> None:
    """Searching only what is new: 64 KiB a byte at a time would be 2 billion steps if
    every piece re-read the whole head."""
    reader = ResponseReader(BIG)
    reader.feed(b"HTTP/1.1 200 OK\r\nX: ")
    for _ in range(20_000):
        reader.feed(b"a")
    assert reader.feed(b"\r\nContent-Length: 0\r\n\r\n")
    assert len(reader.headers["x"]) == 20_000


# --- against h11 -----------------------------------------------------------------------------

_NAMES = st.sampled_from(["X-Id", "server", "Date", "Retry-After", "x-a", "Vary", "Set-Cookie"])
_VALUES = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12)


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    """A well-formed answer (sometimes after interim ones), in one of its framings."""
    out = b""
    for _ in range(draw(st.integers(0, 2))):
        out += f"HTTP/1.1 {draw(st.sampled_from([100, 102, 103]))} Info\r\n\r\n".encode()
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 400, 404, 429, 500, 503]))
    reason = draw(st.sampled_from([" OK", " Some Reason", "", " "]))
    eol = draw(st.sampled_from(["\r\n", "\r\n", "\n"]))
    lines = [f"HTTP/{version} {status}{reason}"]
    for _ in range(draw(st.integers(0, 4))):
        name, value = draw(_NAMES), draw(_VALUES)
        lines.append(f"{name}:{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{value}")
        if value and draw(st.booleans()):
            lines.append(f" {draw(_VALUES)}")  # an obsolete fold
    if draw(st.booleans()):
        lines.append(f"Connection: {draw(st.sampled_from(['close', 'keep-alive', 'Close']))}")
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if status in (204, 304):
        framing, body = "none", b""
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
        if draw(st.booleans()):
            lines.append(f"content-length: {len(body)}")  # repeated, agreeing
        tail = body
    elif framing == "chunked":
        lines.append(f"Transfer-Encoding: {draw(st.sampled_from(['chunked', 'Chunked']))}")
        tail, rest = b"", body
        while rest:
            size = draw(st.integers(1, max(1, len(rest))))
            ext = draw(st.sampled_from(["", ";a=b", ";x"]))
            tail += f"{size:x}{ext}\r\n".encode() + rest[:size] + b"\r\n"
            rest = rest[size:]
        tail += b"0\r\n" + (b"Trailer-A: 1\r\n" if draw(st.booleans()) else b"") + b"\r\n"
    else:
        tail = body
    out += (eol.join(lines) + eol + eol).encode("latin-1") + tail
    return out


@given(answers(), st.lists(st.integers(0, 10_000), max_size=6))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_well_formed_answers_read_as_h11_reads_them(data: bytes, cuts: list[int]) -> None:
    pieces = split(data, cuts)
    theirs = read_with_h11(pieces)
    ours = read(pieces)
    assert (ours.status, ours.headers, ours.body) == (theirs.status, theirs.headers, theirs.body)
    framing = {"content-length", "transfer-encoding"} & set(ours.headers)
    if framing or ours.status in (204, 304):
        assert ours.reusable == theirs.reusable
    else:  # h11 calls a connection whose answer ran until the close reusable; it is closed
        assert not ours.reusable


@given(answers(), st.lists(st.tuples(st.integers(0, 10_000), st.binary(max_size=3)), max_size=4),
       st.lists(st.integers(0, 10_000), max_size=4))  # fmt: skip
@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@example(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", [(15, b"\r\n")], [])
def test_on_damaged_bytes_whatever_both_read_they_read_alike(
    data: bytes, damage: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    damaged = bytearray(data)
    for where, what in damage:
        at = where % (len(damaged) + 1)
        damaged[at : at + len(what)] = what
    pieces = split(bytes(damaged), cuts)
    try:
        ours: ResponseReader | None = read(pieces)
    except MalformedAnswer:
        ours = None
    try:
        theirs: H11Answer | None = read_with_h11(pieces)
    except h11.ProtocolError:
        theirs = None
    if ours is not None and theirs is not None:
        assert (ours.status, ours.headers) == (theirs.status, theirs.headers)
        if ours.reusable:
            assert theirs.reusable
            assert ours.body == theirs.body


@given(st.binary(max_size=400), st.lists(st.integers(0, 1000), max_size=5))
def test_any_bytes_are_an_answer_or_a_malformed_one(data: bytes, cuts: list[int]) -> None:
    try:
        reader = read(split(data, cuts), body_max=64)
    except MalformedAnswer:
        return
    assert 200 <= reader.status <= 999
    assert len(reader.body) <= 64
