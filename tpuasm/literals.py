"""Integer literals as the assembler reads them.  Kept free of lark so the command line
parses `--config ub_rows=0x100` with the same rules without loading the parser."""
from __future__ import annotations


def parse_int(text: str) -> int | None:
    """Decimal, 0x, 0b or 0o with `_` separators; None if malformed or longer than
    limits.MAX_LITERAL_CHARS (int() of a huge digit string is slow)."""
    if len(text) > 200:          # tpuasm.limits.MAX_LITERAL_CHARS, kept free of imports here
        return None
    try:
        return int(text, 0)
    except ValueError:
        pass
    # int(x, 0) refuses leading zeros ("007"); a decimal with them is still clear.
    if text.replace("_", "").isdigit() and not text.startswith("_") and "__" not in text \
            and not text.endswith("_"):
        return int(text.replace("_", ""), 10)
    return None
