"""Problem 10: inside a macro or a .rept, the gutter says which expansion is executing
(its position among the instructions of that source line, which the assembler's location
map gives: an independent record)."""
from __future__ import annotations

from debugger.source_view import SourceView
from test_debugger_support import here  # noqa: F401
from test_debugger_ui import command, open_app, pilot_test

REPT = """\
.config array_size=8, ub_rows=64, acc_rows=32
.host x, 4
.ub   input, 4
.macro COPY
    RHM host.x, input, 4
.endm
.rept 5
    COPY
.endr
    HLT
"""


@pilot_test
async def test_gutter_names_the_expansion_in_flight(here):
    async with open_app(here, REPT, "rept.tasm") as (app, pilot):
        view = app.query_one(SourceView)
        await command(pilot, "until *3")             # the 4th copy is next to issue
        line = view.listing.line_of[3]
        assert len(view.listing.indices_of[line]) == 5
        assert "▶ 4/5" in " ".join(view.expansions[line])
        y = line - 1 - int(view.scroll_offset.y)
        assert "▶ 4/5" in view.render_line(y).text
        await command(pilot, "step 2")                 # the 4th copy issues into the input stage
        text = view.render_line(line - 1 - int(view.scroll_offset.y)).text
        assert "I 4/5" in text and "▶ 5/5" in text
