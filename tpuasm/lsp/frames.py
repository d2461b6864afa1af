"""The server's stdin, bounded: a client's `Content-Length: 99999999999` or a header line
without an end must not make the server allocate what the client claims.

pygls reads a frame as header lines (`readline`) and then `read(Content-Length)` bytes.
`BoundedInput` gives it header lines of at most MAX_HEADER_LINE bytes, and a body larger
than MAX_MESSAGE_BYTES is read and dropped in chunks (the stream stays in step with the
client) and replaced by an empty JSON object, which pygls reports as a bad message and
goes on; at the end of the stream the server stops as usual.  spec/limits.md.
"""
from __future__ import annotations

import sys

from ..limits import MAX_SOURCE_BYTES

MAX_HEADER_LINE = 8 * 1024
# an LSP message carries at most a whole document (as JSON, escaped) and some framing
MAX_MESSAGE_BYTES = 2 * MAX_SOURCE_BYTES + (1 << 20)
_CHUNK = 1 << 20


class BoundedInput:
    def __init__(self, stream, log=None):
        self.stream = stream
        self.log = log or (lambda text: print(f"tpuasm lsp: {text}", file=sys.stderr))

    def readline(self, size: int = -1) -> bytes:
        limit = MAX_HEADER_LINE if size is None or size < 0 else min(size, MAX_HEADER_LINE)
        return self.stream.readline(limit)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_MESSAGE_BYTES:
            self.log(f"a message of {n:,} bytes is over the {MAX_MESSAGE_BYTES:,}-byte limit;"
                     " dropped")
            left = n if n is not None and n >= 0 else 0
            while left > 0:
                chunk = self.stream.read(min(_CHUNK, left))
                if not chunk:
                    return b""               # the client went away: the server stops
                left -= len(chunk)
            return b"{}"
        return self.stream.read(n)
