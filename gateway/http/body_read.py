"""Reading a request's body off the wire: within its time limit, decoded per its
Content-Encoding (as aiohttp reads it for `serve`, and for the picker, which gets Envoy's bytes
whole), and the errors after which the rest of a body cannot be read.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.compression_utils import BrotliDecompressor, ZLibDecompressor, ZSTDDecompressor
from multidict import MultiMapping

from gateway.http.errors import ApiError, echoed


class UnreadBody(ApiError):
    """An error after which the rest of the body cannot be read: the answer closes the
    connection (aiohttp would otherwise try to read on, and fail again, and log it)."""


def body_late(timeout_s: float) -> UnreadBody:
    """A body that did not arrive within ``timeout_s`` of its request's head."""
    return UnreadBody(
        408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
    )


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The body, decoded per its Content-Encoding, within `timeout_s` of the headers."""
    encoding = declared_encoding(request.headers)
    if encoding and coding(encoding) is None:
        raise unsupported_encoding(encoding)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        error = body_late(timeout_s)
    except ConnectionResetError:
        # The client left mid-body: nobody reads the answer, but the request is counted.
        error = UnreadBody(499, "The client closed the connection.", code="client_closed")
    except web.HTTPRequestEntityTooLarge:
        request.content.feed_eof()
        raise
    except web.RequestPayloadError:
        # aiohttp decodes per Content-Encoding as it reads: this body is not what its
        # header says (or the connection broke mid-body).
        error = invalid_encoding(request.headers.get("Content-Encoding", "identity"))
    request.content.feed_eof()
    raise error


def invalid_encoding(encoding: str) -> UnreadBody:
    """A body that is not what its Content-Encoding says."""
    return UnreadBody(
        400, f"The request body could not be read as Content-Encoding {encoding!r}.",
        code="invalid_content_encoding",
    )  # fmt: skip


def body_too_large(limit: int) -> UnreadBody:
    """Read up to the limit and no further: the rest of the body is still on the wire, so the
    connection closes after the answer (kept alive, the next request on it would be lost)."""
    return UnreadBody(
        413, f"The request body is larger than the limit of {limit} bytes.",
        code="request_too_large",
    )  # fmt: skip


DECODED_ENCODINGS = frozenset(("gzip", "deflate", "br", "zstd"))
"""The Content-Encodings aiohttp decodes as it reads a body for `serve`."""
_AS_IT_CAME = frozenset(("", "identity"))


def declared_encoding(headers: MultiMapping[str]) -> str:
    """The request's Content-Encoding, "" for none: two header lines are a list, as one
    "gzip, identity" is (aiohttp would decode by the last line alone)."""
    return ", ".join(headers.getall("Content-Encoding", ()))


def coding(encoding: str) -> str | None:
    """The one content coding a Content-Encoding names ("" for none), or None for one the
    gateway cannot read (unknown, or a list: aiohttp decodes one coding, and a body read as
    it came would be parsed as JSON it is not)."""
    name = encoding.strip().lower() if encoding.isascii() else "?"
    return name if name in DECODED_ENCODINGS or name in _AS_IT_CAME else None


def unsupported_encoding(encoding: str) -> UnreadBody:
    return UnreadBody(
        415,
        f"The request body's Content-Encoding {echoed(encoding)!r} is not one the gateway reads: "
        f"{', '.join(sorted(DECODED_ENCODINGS))} or identity.",
        param="Content-Encoding", code="unsupported_content_encoding",
    )  # fmt: skip


def decode_body(raw: bytes, encoding: str, limit: int) -> bytes:
    """``raw`` decoded per its Content-Encoding as `serve` reads it (aiohttp's decompressors,
    for a body that arrived whole, as Envoy hands it to the picker); ``limit``: the most bytes
    it may decode to, as a compressed body must not get round the body limit."""
    name = coding(encoding)
    if name is None:
        raise unsupported_encoding(encoding)
    if name in _AS_IT_CAME or not raw:
        return raw
    try:
        decompressor: BrotliDecompressor | ZLibDecompressor | ZSTDDecompressor
        if name == "br":
            decompressor = BrotliDecompressor()
        elif name == "zstd":
            decompressor = ZSTDDecompressor()
        else:
            # aiohttp's leniency: a "deflate" body without its zlib header (raw deflate).
            bare = name == "deflate" and raw[0] & 0xF != 8
            decompressor = ZLibDecompressor(encoding=name, suppress_deflate_header=bare)
        decoded = decompressor.decompress_sync(raw, max_length=limit + 1)
    except Exception:  # each codec raises its own errors; a codec not installed: RuntimeError
        raise invalid_encoding(encoding) from None
    if len(decoded) > limit:
        raise body_too_large(limit)
    if isinstance(decompressor, ZLibDecompressor) and name == "deflate" and not decompressor.eof:
        raise invalid_encoding(encoding)  # a truncated deflate stream, as aiohttp refuses it
    return decoded
