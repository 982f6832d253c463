"""HTTP/1.1 for the webhook client, without I/O: a POST's bytes, and a reader of its answer.

Why our own and not h11: the client sends one kind of request (a POST with a body of known
length) and reads one answer per request; h11's general state machine cost a quarter of a
node's CPU per webhook delivery (``Request`` validation, ``send`` and ``next_event`` were
26 % of the trio thread's samples in ``benchmarks/bench_webhooks.py``). This module does the
same two jobs in a few microseconds, to the same rules; ``tests/handlers/test_http1.py``
checks it against h11 on generated answers (the same status, headers, body and keep-alive
verdict for every answer h11 reads, in every split into packets) and on arbitrary bytes.

**The request** (:func:`encode_request`): ``POST <target> HTTP/1.1``, the caller's headers
(``Host`` among them) and ``Content-Length``. Header names must be tokens and values printable
ASCII (tab allowed): nothing a caller passes can split the head (no CR, LF or NUL).

**The answer** (:class:`ResponseReader`, fed bytes as they arrive, ``b""`` at EOF), read as
RFC 9112 says and as h11 does:

* the status line ``HTTP/1.x NNN reason`` (the reason may be missing); interim answers
  (``1xx`` other than ``101``) are skipped; ``101`` is an error (nothing asked to switch);
* header lines ``name: value`` (names are tokens, lower-cased; values without control
  characters, surrounding blanks removed; obsolete line folding joined with a space); lines
  may end in CRLF or LF; the head is at most ``head_max_bytes`` (64 KiB by default);
* the body's framing: none for ``204`` and ``304``; ``Transfer-Encoding: chunked`` (any
  other transfer coding is an error) with chunk extensions and trailers; else
  ``Content-Length`` (digits; repeated values must agree); else until the connection closes;
* at most ``body_max_bytes`` of the body are kept: a longer body is not read to its end.

**Keep-alive** (:attr:`ResponseReader.reusable`): only after a complete HTTP/1.1 answer
framed by length or chunks, without ``Connection: close``, without both
``Transfer-Encoding`` and ``Content-Length`` (a smuggling shape), read to its end, and with
no byte after it. Bytes after the answer were sent unasked: h11 would keep them for the next
request and read them as *its* answer, so here the connection is discarded instead.

Any violation raises :class:`MalformedAnswer` with what was wrong.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["HEAD_BYTES_MAX", "MalformedAnswer", "ResponseReader", "encode_request"]

HEAD_BYTES_MAX: Final = 64 * 1024
"""Longest status line plus headers (and, separately, chunk trailers) accepted."""
CHUNK_LINE_BYTES_MAX: Final = 1024
"""Longest chunk-size line (with its extensions) accepted."""

_TOKEN: Final = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE: Final = re.compile(r"[\t\x20-\x7e]*")
_TARGET: Final = re.compile(rb"/[\x21-\x7e]*")
_STATUS_LINE: Final = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: (?:[ \t]|[^\x00\s])*)?")
_DIGITS: Final = re.compile(r"[0-9]+")
_FIELD: Final = re.compile(
    rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*"
    rb"((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*"
)
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*\r?")
_HEAD_END: Final = re.compile(rb"\n\r?\n")
_LINE_END: Final = re.compile(rb"\r?\n")


class MalformedAnswer(Exception):
    """The bytes received are not a well-formed HTTP/1.1 answer (or were cut off)."""


def encode_request(target: bytes, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A POST of ``body`` to ``target`` with ``headers`` (``Host`` included) and its
    ``Content-Length``; :class:`ValueError` if a header could split the head."""
    if _TARGET.fullmatch(target) is None:
        raise ValueError(f"{target!r} is not a valid request target")
    lines = [f"POST {target.decode('ascii')} HTTP/1.1\r\n"]
    for name, value in headers:
        if _TOKEN.fullmatch(name) is None:
            raise ValueError(f"{name!r} is not a valid header name")
        if _VALUE.fullmatch(value) is None:
            raise ValueError(f"the value of header {name!r} is not printable ASCII")
        lines.append(f"{name}: {value}\r\n")
    lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    return "".join(lines).encode("ascii") + body


# The reader's states.
_HEAD: Final = 0
_LENGTH: Final = 1
_CHUNK_SIZE_LINE: Final = 2
_CHUNK_DATA: Final = 3
_CHUNK_END: Final = 4
_TRAILERS: Final = 5
_UNTIL_CLOSE: Final = 6
_DONE: Final = 7


class ResponseReader:
    """Reads one answer from the bytes fed to it (see the module docstring).

    :meth:`feed` returns ``True`` once the answer is complete, or once ``body_max_bytes`` of
    its body are kept (the rest is not read; the connection is then not reusable). After
    that, :attr:`status`, :attr:`headers` and :attr:`body` hold the answer.
    """

    __slots__ = (
        "_body",
        "_buffer",
        "_closes",
        "_remaining",
        "_scanned",
        "_state",
        "body_max_bytes",
        "head_max_bytes",
        "headers",
        "reusable",
        "started",
        "status",
    )

    def __init__(self, body_max_bytes: int, head_max_bytes: int = HEAD_BYTES_MAX) -> None:
        self.body_max_bytes = body_max_bytes
        self.head_max_bytes = head_max_bytes
        self.status = 0
        self.headers: dict[str, str] = {}
        """Names lower-case; of a repeated header, the last value."""
        self.reusable = False
        """Whether the connection may carry the next request (see the module docstring)."""
        self.started = False
        """Whether any byte of the answer has been received."""
        self._state = _HEAD
        self._buffer = b""
        self._body = bytearray()
        self._remaining = 0
        self._scanned = 0
        """How much of the buffer was searched for the end of a head (or trailers)."""
        self._closes = False

    @property
    def body(self) -> bytes:
        return bytes(self._body)

    def feed(self, data: bytes | bytearray) -> bool:
        """Take ``data`` (``b""``: the receiver closed its side); whether the answer is
        complete (or its body cap reached). :class:`MalformedAnswer` if it cannot be."""
        if self._state == _DONE:
            if data:
                self.reusable = False  # bytes nobody asked for
            return True
        if not data:
            return self._at_eof()
        self.started = True
        buffer = self._buffer + data if self._buffer else bytes(data)
        self._buffer = b""
        while buffer:
            state = self._state
            if state == _HEAD:
                buffer = self._read_head(buffer)
            elif state == _LENGTH:
                buffer = self._read_length(buffer)
            elif state == _UNTIL_CLOSE:
                self._keep(buffer)
                buffer = b""
            elif state == _CHUNK_DATA:
                buffer = self._read_chunk_data(buffer)
            elif state == _CHUNK_SIZE_LINE:
                buffer = self._read_chunk_size(buffer)
            elif state == _CHUNK_END:
                buffer = self._read_chunk_end(buffer)
            elif state == _TRAILERS:
                buffer = self._read_trailers(buffer)
            else:  # _DONE with bytes left over: sent unasked
                self.reusable = False
                return True
            if self._state == _DONE:
                if buffer:
                    self.reusable = False
                return True
            if len(self._body) >= self.body_max_bytes and self._state != _DONE:
                self.reusable = False
                return True  # the cap: the rest is not read
        return False

    def _at_eof(self) -> bool:
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self.reusable = False
            return True
        if self._state == _HEAD and not self.started:
            raise MalformedAnswer("the receiver closed the connection before answering")
        raise MalformedAnswer("the receiver closed the connection in the middle of its answer")

    def _keep(self, data: bytes) -> None:
        room = self.body_max_bytes - len(self._body)
        if room > 0:
            self._body += data[:room] if len(data) > room else data

    # --- the head ------------------------------------------------------------------------

    def _read_head(self, buffer: bytes) -> bytes:
        # Search only what was not searched before: a receiver trickling its head a byte
        # at a time costs linear work, not quadratic.
        end = _HEAD_END.search(buffer, max(self._scanned - 2, 0))
        if end is None:
            if len(buffer) > self.head_max_bytes:
                raise MalformedAnswer(f"the answer's head is over {self.head_max_bytes} bytes")
            self._buffer = buffer
            self._scanned = len(buffer)
            return b""
        self._scanned = 0
        if end.start() > self.head_max_bytes:
            raise MalformedAnswer(f"the answer's head is over {self.head_max_bytes} bytes")
        lines = _lines(buffer[: end.start()])
        rest = buffer[end.end() :]
        status_line = _STATUS_LINE.fullmatch(lines[0])
        if status_line is None:
            raise MalformedAnswer(f"not an HTTP/1.1 status line: {lines[0][:100]!r}")
        minor, code = status_line.groups()
        status = int(code)
        headers = _fields(lines)
        if status < 200:
            if status < 100:
                raise MalformedAnswer(f"status {status} is not an HTTP status")
            if status == 101:
                raise MalformedAnswer("the receiver switched protocols (101) unasked")
            return rest  # an interim answer: the final one follows
        self.status = status
        closes = minor == b"0"
        length: str | None = None
        chunked = False
        for name, value in headers:
            if name == "connection":
                if "close" in (token.strip(" \t").lower() for token in value.split(",")):
                    closes = True
            elif name == "content-length":
                given = {part.strip(" \t") for part in value.split(",")}
                number = given.pop() if len(given) == 1 else ""
                if _DIGITS.fullmatch(number) is None:
                    raise MalformedAnswer(f"bad Content-Length {value!r}")
                if length is not None and number != length:
                    raise MalformedAnswer("conflicting Content-Length headers")
                length = number
            elif name == "transfer-encoding":
                if chunked or value.lower() != "chunked":
                    raise MalformedAnswer(f"unsupported Transfer-Encoding {value!r}")
                chunked = True
        self.headers = dict(headers)
        if chunked:
            self.headers["transfer-encoding"] = "chunked"
        if chunked and length is not None:
            closes = True  # both framings: read as chunked, never trusted with another request
        self._closes = closes
        if status in (204, 304):
            self._finish()
        elif chunked:
            self._state = _CHUNK_SIZE_LINE
        elif length is not None:
            self._remaining = int(length)
            if self._remaining:
                self._state = _LENGTH
            else:
                self._finish()
        else:
            self._closes = True
            self._state = _UNTIL_CLOSE
        return rest

    def _finish(self) -> None:
        self._state = _DONE
        self.reusable = not self._closes

    # --- bodies --------------------------------------------------------------------------

    def _read_length(self, buffer: bytes) -> bytes:
        remaining = self._remaining
        if len(buffer) < remaining:
            self._keep(buffer)
            self._remaining = remaining - len(buffer)
            return b""
        self._keep(buffer[:remaining] if len(buffer) > remaining else buffer)
        self._finish()
        return buffer[remaining:]

    def _read_chunk_size(self, buffer: bytes) -> bytes:
        end = buffer.find(b"\n")
        if end < 0:
            if len(buffer) > CHUNK_LINE_BYTES_MAX:
                raise MalformedAnswer("a chunk-size line is too long")
            self._buffer = buffer
            return b""
        line = _CHUNK_SIZE.fullmatch(buffer, 0, end)
        if line is None or buffer[end - 1 : end] != b"\r":
            raise MalformedAnswer(f"bad chunk-size line {buffer[:end][:100]!r}")
        size = int(line.group(1), 16)
        if size:
            self._remaining = size
            self._state = _CHUNK_DATA
        else:
            self._remaining = 0
            self._state = _TRAILERS
        return buffer[end + 1 :]

    def _read_chunk_data(self, buffer: bytes) -> bytes:
        remaining = self._remaining
        if len(buffer) < remaining:
            self._keep(buffer)
            self._remaining = remaining - len(buffer)
            return b""
        self._keep(buffer[:remaining])
        self._state = _CHUNK_END
        return buffer[remaining:]

    def _read_chunk_end(self, buffer: bytes) -> bytes:
        if len(buffer) < 2:
            if buffer != b"\r":
                raise MalformedAnswer("a chunk is not followed by CRLF")
            self._buffer = buffer
            return b""
        if buffer[:2] != b"\r\n":
            raise MalformedAnswer("a chunk is not followed by CRLF")
        self._state = _CHUNK_SIZE_LINE
        return buffer[2:]

    def _read_trailers(self, buffer: bytes) -> bytes:
        # No trailer at all: the blank line right away.
        if buffer[:2] == b"\r\n" or buffer[:1] == b"\n":
            self._finish()
            return buffer[2:] if buffer[:1] == b"\r" else buffer[1:]
        if buffer == b"\r":
            self._buffer = buffer
            return b""
        end = _HEAD_END.search(buffer, max(self._scanned - 2, 0))
        if end is None:
            if len(buffer) > self.head_max_bytes:
                raise MalformedAnswer(f"the answer's trailers are over {self.head_max_bytes} bytes")
            self._buffer = buffer
            self._scanned = len(buffer)
            return b""
        self._scanned = 0
        _fields([b"", *_lines(buffer[: end.start()])])  # checked, not kept
        self._finish()
        return buffer[end.end() :]


def _lines(head: bytes) -> list[bytes]:
    """The lines of a head that ended at a blank line (its last CR is the blank line's)."""
    return _LINE_END.split(head[:-1] if head[-1:] == b"\r" else head)


def _fields(lines: list[bytes]) -> list[tuple[str, str]]:
    """The header fields of ``lines[1:]`` (``lines[0]`` is the status line): (lower-case
    name, value). An obsolete fold (a line starting with a blank) continues the line before
    it, joined by one space, and the joined line is checked whole."""
    joined: list[bytes] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            if not joined:
                raise MalformedAnswer("a continuation line before any header")
            joined[-1] += b" " + line.lstrip(b" \t")
        else:
            joined.append(line)
    fields: list[tuple[str, str]] = []
    for line in joined:
        field = _FIELD.fullmatch(line)
        if field is None:
            raise MalformedAnswer(f"a malformed header line: {line[:100]!r}")
        fields.append((field.group(1).decode("ascii").lower(), field.group(2).decode("latin-1")))
    return fields
