"""Graph nodes (`.node`, issue 10 part 3): `break node NAME`, the node in messages and in
the source pane's node column.  Expected indices come from the assembler's own node map
(Program.node_runs), an independent record of which instruction belongs to which node."""
from __future__ import annotations

from debugger.commands import Engine
from debugger.source_view import SourceView
from test_debugger_support import SMALL, here, make_session  # noqa: F401
from test_debugger_ui import open_app, pilot_test

# SMALL with its two layers named as a compiler would name them
NODES = SMALL.replace("    RHM  host.x", ".node input_copy\n    RHM  host.x") \
             .replace("    MMC.SO input", ".node fc1\n    MMC.SO input") \
             .replace("    MMC.SO hidden", '.node "/fc2/MatMul"\n    MMC.SO hidden') \
             .replace("    WHM", ".node\n    WHM")


def test_break_node_stops_before_the_first_instruction_of_the_node(here):
    engine = Engine(make_session(here, NODES, "nodes.tasm"))
    program = engine.session.program
    first = program.node_runs("/fc2/MatMul")[0].start
    r = engine.execute("break node /fc2/MatMul")
    assert r.ok and f"(instruction #{first})" in r.text()
    r = engine.execute("continue")
    assert r.stop.kind == "breakpoint" and r.stop.index == first
    assert "node /fc2/MatMul" in r.text()
    assert engine.session.machine.issue_cycle(first) == -1
    assert engine.session.machine.issue_cycle(first - 1) >= 0


def test_break_on_an_unknown_node_lists_the_nodes(here):
    engine = Engine(make_session(here, NODES, "nodes.tasm"))
    r = engine.execute("break node conv9")
    assert not r.ok and "no graph node 'conv9'" in r.text() and "fc1" in r.text()
    r = Engine(make_session(here)).execute("break node fc1")
    assert not r.ok and "names no nodes" in r.text()


@pilot_test
async def test_source_pane_shows_the_node_of_each_line(here):
    async with open_app(here, NODES, "nodes.tasm") as (app, pilot):
        view = app.query_one(SourceView)
        program = app.session.program
        for line, indices in view.listing.indices_of.items():
            node = program.node_of(min(indices))
            text = view.render_line(line - 1 - int(view.scroll_offset.y)).text \
                if 0 <= line - 1 - int(view.scroll_offset.y) < view.size.height else None
            if text is not None and node:
                assert node[:6] in text, (line, text)
        assert "node input_copy" in view.border_title
