"""The server's log (its stderr, which editors show in an output panel): one line per
event.  pygls logs a frame it cannot read (bad JSON, a position out of range) with the
whole Python traceback; a client's bad message is the client's problem, told in one line:
`tpuasm lsp: Unable to handle message (JSONDecodeError: Expecting ',' delimiter ...)`."""
from __future__ import annotations

import logging
import sys


class OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # pygls sometimes formats the traceback into the message itself: keep its first
        # line and the exception the traceback ends with
        lines = [line.strip(" |") for line in record.getMessage().splitlines()
                 if line.strip(" |")]
        text = f"tpuasm lsp: {lines[0] if lines else ''}"
        if len(lines) > 1:
            text += f" ({lines[-1]})"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            cause = error.__cause__ or error.__context__
            why = f"{type(error).__name__}: {error}"
            if cause is not None:
                why += f" <- {type(cause).__name__}: {cause}"
            text += f" ({why})"
        return " ".join(text.split())[:2000]


# pygls's own, and where its callbacks' and tasks' failures are reported (a request whose
# id is a list makes pygls's result callback fail: concurrent.futures logs it)
LOGGERS = ("pygls", "concurrent.futures", "asyncio")


def configure(stream=None) -> logging.Handler:
    """Warnings and errors of LOGGERS to `stream` (stderr), one line each."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(OneLineFormatter())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    return handler
