"""`tpuasm lsp` over a real connection: a subprocess speaking JSON-RPC on stdio, driven
as an editor drives it.  Expected answers are worked out by hand from the sources below
(lines and characters are 0-based, as LSP counts)."""
from __future__ import annotations

import json

import numpy as np

import pytest
from pygls.uris import from_fs_path

from lsp_client import LspClient, LspError, at, doc
from tpuasm.assembler import assemble
from tpuasm.diagnostics import Diagnostic
from tpuasm.errors import AssemblyError
from tpuasm.isa import ISA_TABLE

LIB = """\
.equ N, 4
.macro LOAD dst
    RHM host.x, \\dst, N
    NOP
.endm
"""
MAIN = """\
.include "lib.tasm"
.host x, N
.ub   y, N * 2
.acc  s, N
start:
    LOAD ub.y
    MMC.SO ub.y, acc.s, N
    CFG act_shift, 0x1f
    HLT
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ws")
    (root / "lib.tasm").write_text(LIB)
    (root / "main.tasm").write_text(MAIN)
    client = LspClient("--debounce", "0.05")
    init = client.initialize(from_fs_path(str(root)))
    client.root = root
    client.caps = init["capabilities"]
    client.main = from_fs_path(str(root / "main.tasm"))
    client.lib = from_fs_path(str(root / "lib.tasm"))
    client.open(client.main, MAIN)
    client.first = client.diagnostics(client.main)
    yield client
    assert client.close() == 0


def test_capabilities(server):
    caps = server.caps
    for key in ("hoverProvider", "completionProvider", "definitionProvider", "referencesProvider",
                "renameProvider", "documentSymbolProvider", "documentFormattingProvider",
                "semanticTokensProvider", "inlayHintProvider"):
        assert caps.get(key), key


def test_lint_warning_in_a_macro_shows_at_the_definition_and_the_call(server):
    # the NOP in LOAD (lib.tasm line 4) pads nothing: lint's warning, shown at the call
    # site in main.tasm (line 6, `LOAD`) with the definition as related information
    [d] = server.first
    assert d["severity"] == 2 and "NOP is unnecessary" in d["message"]
    assert d["range"] == {"start": at(5, 4), "end": at(5, 8)}
    related = d["relatedInformation"][0]["location"]
    assert related["uri"] == server.lib and related["range"]["start"] == at(3, 4)


def test_errors_have_the_assemblers_texts_and_ranges(server, tmp_path):
    bad = "RHM host.x, 0, 1\nMMC.Q 0, 0, 1\nHLT\n"
    uri = from_fs_path(str(server.root / "bad.tasm"))
    server.open(uri, bad)
    got = server.diagnostics(uri)
    with pytest.raises(AssemblyError) as e:
        assemble(bad, str(server.root / "bad.tasm"))
    expected = sorted((d.message, d.line - 1, d.col - 1) for d in e.value.diagnostics)
    assert sorted((d["message"], d["range"]["start"]["line"], d["range"]["start"]["character"])
                  for d in got) == expected
    flag = next(d for d in got if "flag" in d["message"])
    assert flag["range"] == {"start": at(1, 4), "end": at(1, 5)}      # the Q of MMC.Q
    # an edit re-checks (debounced): fixing both lines leaves no diagnostics
    server.change(uri, 2, "RHM 0, 0, 1\nMMC 0, 0, 1\nHLT\n")
    assert server.diagnostics(uri) == []


def test_errors_in_an_included_file_show_at_the_include(server):
    uri = from_fs_path(str(server.root / "inc.tasm"))
    (server.root / "broken.tasm").write_text(".equ A, B\n")
    server.open(uri, '.include "broken.tasm"\nHLT\n')
    [d] = server.diagnostics(uri)
    assert d["message"].startswith("undefined symbol 'B'")
    assert d["range"]["start"]["line"] == 0
    assert d["relatedInformation"][0]["location"]["uri"].endswith("broken.tasm")


def hover_text(server, line, character, uri=None):
    result = server.request("textDocument/hover", doc(uri or server.main, line, character))
    return result and result["contents"]["value"]


def test_hover_instruction_flags_register_number_symbols(server):
    text = hover_text(server, 6, 5)                          # MMC.SO
    assert "MatrixMultiply" in text and "stage *matrix*" in text
    assert "**`S` switch**" in text and "**`O` overwrite**" in text and "`U` unsigned_input" in text
    assert "Timing: 1 cycle per input vector" in text
    text = hover_text(server, 7, 9)                          # act_shift
    assert "configuration register 1" in text and "Range 0 .. 62, reset 0" in text
    assert "`0x1f` = `31` = `0x1f` = `0b11111`" in hover_text(server, 7, 20)
    text = hover_text(server, 2, 7)                          # .ub y, N * 2
    assert "ub.y" in text and "base 0 (0x0), 8 rows (0 .. 7)" in text
    text = hover_text(server, 1, 11)                         # N, defined in lib.tasm
    assert "`.equ N, 4`" in text and "= 4 (0x4)" in text and "lib.tasm:1" in text
    assert "`.macro LOAD dst`" in hover_text(server, 5, 6)
    assert "`.include \"file.tasm\"`" in hover_text(server, 0, 3)
    assert hover_text(server, 4, 2).startswith("**start:** — label of instruction 0")


def labels(result):
    return {i["label"] for i in result["items"]}


def test_completion(server):
    server.change(server.main, 2, MAIN + "    MMC.S\n    CFG \n    ACT acc.s, ub.\n    \n")
    heads = labels(server.request("textDocument/completion", doc(server.main, 12, 4)))
    assert {"MMC", "Read_Host_Memory", "HLT", ".rept", ".equ", "LOAD"} <= heads
    flags = labels(server.request("textDocument/completion", doc(server.main, 9, 9)))
    assert flags == {"MMC.SC", "MMC.SO", "MMC.SU", "MMC.SW", "MMC.SH", "MMC.SD"}
    regs = labels(server.request("textDocument/completion", doc(server.main, 10, 8)))
    assert regs == set(ISA_TABLE.registers)          # every register of spec/isa.toml
    assert {"act_mult", "conv_pitch", "dma_ub_stride", "act_params"} <= regs
    assert labels(server.request("textDocument/completion", doc(server.main, 11, 18))) == {"ub.y"}
    operands = labels(server.request("textDocument/completion", doc(server.main, 6, 24)))
    assert {"N", "ub.y", "acc.s", "host.x", "ub.", "repeat=", "len="} <= operands
    server.change(server.main, 3, MAIN)


def test_definition_references_across_files(server):
    loc = server.request("textDocument/definition", doc(server.main, 6, 24))   # N
    assert loc["uri"] == server.lib and loc["range"] == {"start": at(0, 5), "end": at(0, 6)}
    refs = server.request("textDocument/references",
                          {**doc(server.main, 6, 24), "context": {"includeDeclaration": True}})
    assert sorted((r["uri"] == server.lib, r["range"]["start"]["line"],
                   r["range"]["start"]["character"]) for r in refs) == [
        (False, 1, 9), (False, 2, 9), (False, 3, 9), (False, 6, 24),
        (True, 0, 5), (True, 2, 22)]
    loc = server.request("textDocument/definition", doc(server.main, 6, 13))  # ub.y's y
    assert loc["uri"] == server.main and loc["range"]["start"] == at(2, 6)
    loc = server.request("textDocument/definition", doc(server.main, 0, 12))  # the include
    assert loc["uri"] == server.lib
    loc = server.request("textDocument/definition", doc(server.main, 5, 5))   # LOAD
    assert loc["uri"] == server.lib and loc["range"]["start"] == at(1, 7)


def test_rename_across_included_files(server):
    edit = server.request("textDocument/rename", {**doc(server.main, 6, 24), "newName": "ROWS"})
    changes = edit["changes"]
    assert sorted(changes) == sorted([server.main, server.lib])
    assert sorted(e["range"]["start"]["line"] for e in changes[server.lib]) == [0, 2]
    assert all(e["newText"] == "ROWS" for es in changes.values() for e in es)
    # applying the edit gives a program that assembles to the same code
    assert _apply(MAIN, changes[server.main]) != MAIN
    with pytest.raises(LspError):
        server.request("textDocument/rename", {**doc(server.main, 6, 24), "newName": "2x"})
    r = server.request("textDocument/prepareRename", doc(server.main, 6, 24))
    assert r == {"start": at(6, 24), "end": at(6, 25)}


def _apply(text, edits):
    lines = text.split("\n")
    for e in sorted(edits, key=lambda e: (e["range"]["start"]["line"], e["range"]["start"]["character"]),
                    reverse=True):
        s, t = e["range"]["start"], e["range"]["end"]
        assert s["line"] == t["line"]
        row = lines[s["line"]]
        lines[s["line"]] = row[:s["character"]] + e["newText"] + row[t["character"]:]
    return "\n".join(lines)


def test_rename_result_assembles_the_same(server):
    edit = server.request("textDocument/rename", {**doc(server.main, 3, 7), "newName": "sums"})
    new_main = _apply(MAIN, edit["changes"][server.main])
    assert "acc.sums" in new_main and ".acc  sums, N" in new_main
    (server.root / "renamed.tasm").write_text(new_main)
    before = assemble(server.root / "main.tasm")
    after = assemble(server.root / "renamed.tasm")
    assert before.code() == after.code()


def test_outline_formatting_semantic_tokens_inlay_hints(server):
    outline = server.request("textDocument/documentSymbol", {"textDocument": {"uri": server.main}})
    assert [s["name"] for s in outline] == ["host.x", "ub.y", "acc.s", "start"]
    edits = server.request("textDocument/formatting", {"textDocument": {"uri": server.main},
                                                       "options": {"tabSize": 4, "insertSpaces": True}})
    assert edits[0]["newText"].startswith('.include "lib.tasm"\n.host  x, N\n')
    assert "        MMC.SO  ub.y, acc.s, N\n" in edits[0]["newText"]
    tokens = server.request("textDocument/semanticTokens/full", {"textDocument": {"uri": server.main}})
    legend = server.caps["semanticTokensProvider"]["legend"]["tokenTypes"]
    decoded, line, char = [], 0, 0
    data = tokens["data"]
    for k in range(0, len(data), 5):
        dl, dc, length, kind, _mods = data[k:k + 5]
        line += dl
        char = char + dc if dl == 0 else dc
        decoded.append((line, char, length, legend[kind]))
    assert (6, 4, 3, "keyword") in decoded and (6, 8, 2, "enumMember") in decoded     # MMC . SO
    assert (6, 11, 2, "namespace") in decoded and (6, 14, 1, "variable") in decoded   # ub . y
    assert (5, 4, 4, "macro") in decoded and (7, 8, 9, "property") in decoded          # LOAD, act_shift
    assert (7, 19, 4, "number") in decoded and (0, 9, 10, "string") in decoded
    hints = server.request("textDocument/inlayHint", {"textDocument": {"uri": server.main},
                                                      "range": {"start": at(0, 0), "end": at(20, 0)}})
    assert [(h["position"]["line"], h["label"]) for h in hints] == [(6, "#2"), (7, "#3"), (8, "#4")]
    assert hints[0]["position"]["character"] == len("    MMC.SO ub.y, acc.s, N")


def test_bad_inputs_give_diagnostics_not_a_crash(server):
    root = server.root
    (root / "latin1.tasm").write_bytes(b"; caf\xe9\nHLT\n")
    cases = {
        "notutf8.tasm": ('.include "latin1.tasm"\n', "not valid UTF-8"),
        "missing.tasm": ('.include "nowhere.tasm"\nHLT\n', "cannot read"),
        "self.tasm": ('.include "self.tasm"\nHLT\n', "include cycle"),
        "long.tasm": ("RHM " + "1+" * 1_000_000 + "1, 0, 1\nHLT\n", "2,000,011 characters long"),
    }
    for name, (text, expected) in cases.items():
        uri = from_fs_path(str(root / name))
        (root / name).write_text(text)
        server.open(uri, text)
        got = server.diagnostics(uri)
        assert any(expected in d["message"] for d in got), (name, got)
        server.request("textDocument/hover", doc(uri, 0, 2))
        server.request("textDocument/semanticTokens/full", {"textDocument": {"uri": uri}})
        server.request("textDocument/formatting", {"textDocument": {"uri": uri},
                                                   "options": {"tabSize": 4, "insertSpaces": True}})
    assert server.proc.poll() is None


def test_run_stats_show_in_the_inlay_hints(tmp_path):
    prog = tmp_path / "p.tasm"
    prog.write_text("RHM 0, 0, 4\nRW 0\nMMC.S 0, 0, 4\nHLT\n")
    # the `instruction_cycles` table `tpuasm run --stats` writes (test below), by hand
    rows = [{"index": 0, "issue": 0, "start": 0, "finish": 703},
            {"index": 1, "issue": 703, "start": 703, "finish": 704},
            {"index": 2, "issue": 704, "start": 713, "finish": 733},
            {"index": 3, "issue": 733, "start": 733, "finish": 734}]
    (tmp_path / "p.stats.json").write_text(json.dumps({"cycles": 734, "instruction_cycles": rows}))
    client = LspClient()
    try:
        client.initialize()
        uri = from_fs_path(str(prog))
        client.open(uri, prog.read_text())
        client.diagnostics(uri)
        hints = client.request("textDocument/inlayHint", {"textDocument": {"uri": uri},
                                                          "range": {"start": at(0, 0), "end": at(9, 0)}})
        # stats of another version of the program (more instructions than it has): none
        (tmp_path / "p.stats.json").write_text(json.dumps({"instruction_cycles": rows + [
            {"index": 4, "issue": 734, "start": 734, "finish": 735}]}))
        client.change(uri, 2, prog.read_text() + "\n")
        client.diagnostics(uri)
        stale = client.request("textDocument/inlayHint", {"textDocument": {"uri": uri},
                                                          "range": {"start": at(0, 0), "end": at(9, 0)}})
    finally:
        assert client.close() == 0
    assert [h["label"] for h in hints] == ["#0 issue 0, stall 0", "#1 issue 703, stall 0",
                                           "#2 issue 704, stall 9", "#3 issue 733, stall 0"]
    assert [h["label"] for h in stale] == ["#0", "#1", "#2", "#3"]


def test_stats_document_lists_each_instructions_cycles():
    from tpuasm.runreport import make_machine, stats_document
    program = assemble("RHM 0, 0, 4\nRW 0\nMMC.S 0, 0, 4\nHLT\n", "p.tasm", config={"array_size": 8})
    m = make_machine(program)
    m.load(program, host=np.ones((4, 8), np.int8), weights=np.ones((1, 8, 8), np.int8))
    m.run()
    rows = stats_document(m)["instruction_cycles"]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["issue"] for r in rows] == [m.issue_cycle(i) for i in range(4)]
    assert [r["finish"] for r in rows] == [m.finish_cycle(i) for i in range(4)]
    assert all(r["issue"] <= r["start"] <= r["finish"] for r in rows)
    assert rows[0]["finish"] <= rows[2]["start"]          # the MMC starts after its data arrived


def test_utf8_position_encoding(tmp_path):
    client = LspClient()
    try:
        init = client.initialize(encodings=["utf-8"])
        assert init["capabilities"]["positionEncoding"] == "utf-8"
        uri = from_fs_path(str(tmp_path / "u.tasm"))
        text = ".equ É_, 1\n"          # not a name: the error's column counts bytes in UTF-8
        client.open(uri, ";é\n.equ X, Y\n")
        [d] = client.diagnostics(uri)
        assert d["range"]["start"] == at(1, 8)
        del text
    finally:
        assert client.close() == 0


def test_diagnostic_fields_stay_in_step_with_the_assembler():
    # the server reads Diagnostic's fields by name: fail here, not in an editor, if they move
    assert {"message", "file", "line", "col", "end_col", "severity", "notes"} <= set(
        Diagnostic.__dataclass_fields__)


def test_include_paths_graph_nodes_and_close(server):
    uri = from_fs_path(str(server.root / "nodes.tasm"))
    (server.root / "sub").mkdir(exist_ok=True)
    text = '.include "\n.node "conv1"\n    NOP\n.node relu\n    HLT\n'
    server.open(uri, text)
    server.diagnostics(uri)
    names = labels(server.request("textDocument/completion", doc(uri, 0, 10)))
    assert {"lib.tasm", "main.tasm", "sub/"} <= names and not any(n.endswith(".json") for n in names)
    outline = server.request("textDocument/documentSymbol", {"textDocument": {"uri": uri}})
    assert [(s["name"], s["range"]["start"]["line"]) for s in outline] == [("conv1", 1), ("relu", 3)]
    assert "ONNX node" in hover_text(server, 1, 2, uri)
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert server.diagnostics(uri) == []
