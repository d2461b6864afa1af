"""docs/editors: the generated TextMate grammar is current and highlights what the
assembler reads; the VS Code extension's manifest points at real files."""
from __future__ import annotations

import glob
import json
import re
from pathlib import Path

from tpuasm import tmgrammar
from tpuasm.assembler.expand import DIRECTIVES
from tpuasm.isa import ISA_TABLE
from tpuasm.lsp.hover import DIRECTIVES as DOCUMENTED
from tpuasm.tokens import line_tokens

ROOT = Path(__file__).resolve().parent.parent
VSCODE = ROOT / "docs/editors/vscode"


def test_the_committed_grammar_is_current():
    assert tmgrammar.main(["--check"]) == 0, "run: python -m tpuasm.tmgrammar"


def _pattern(scope_part: str) -> re.Pattern:
    for p in tmgrammar.grammar()["patterns"]:
        names = [p.get("name", "")] + [c["name"] for c in p.get("captures", {}).values()]
        if any(scope_part in n for n in names):
            return re.compile(p["match"])
    raise KeyError(scope_part)


def test_mnemonics_flags_and_directives_of_the_library_are_highlighted():
    mnemonic = _pattern("mnemonic")
    directive = _pattern("directive")
    heads = set()
    for path in glob.glob(str(ROOT / "programs/**/*.tasm"), recursive=True):
        for line in Path(path).read_text().split("\n"):
            tokens = [t for t in line_tokens(line) or () if t.kind != "comment"]
            if len(tokens) >= 2 and tokens[1].text == ":":
                tokens = tokens[2:]
            if tokens and tokens[0].kind == "name":
                heads.add(tokens[0].text)
            elif tokens and tokens[0].kind == "directive":
                assert directive.fullmatch(tokens[0].text), tokens[0].text
    assert heads
    for head in heads:
        base = head.partition(".")[0]
        m = mnemonic.fullmatch(head)
        assert (m is not None) == (ISA_TABLE.lookup(base) is not None), head
        if m and "." in head:
            assert m.group(3) == head.partition(".")[2]
    assert mnemonic.fullmatch("FOO") is None and mnemonic.fullmatch("MMC.SO") is not None


def test_every_directive_has_hover_text_and_a_grammar_entry():
    assert set(DOCUMENTED) == set(DIRECTIVES)
    directive = _pattern("directive")
    assert all(directive.fullmatch("." + d) for d in DIRECTIVES)


def test_the_extension_manifest_names_real_files():
    manifest = json.loads((VSCODE / "package.json").read_text())
    assert (VSCODE / manifest["main"]).is_file()
    [language] = manifest["contributes"]["languages"]
    [grammar] = manifest["contributes"]["grammars"]
    assert grammar["language"] == language["id"] and grammar["scopeName"] == "source.tasm"
    assert (VSCODE / grammar["path"]).is_file() and (VSCODE / language["configuration"]).is_file()
    json.loads((VSCODE / language["configuration"]).read_text())
    assert manifest["contributes"]["configuration"]["properties"]["tpuasm.server.command"]["default"] \
        == ["tpuasm", "lsp"]
