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
            assert m.group(5) == head.partition(".")[2]
    assert mnemonic.fullmatch("FOO") is None and mnemonic.fullmatch("MMC.SO") is not None


def _mnemonics_scoped(line: str) -> list[str]:
    """The words the grammar scopes as mnemonics in `line`: TextMate tries a `^` pattern
    at the line's start only, as Python's re.finditer does without re.MULTILINE."""
    return [m.group(3) for m in _pattern("mnemonic").finditer(line)]


def test_a_mnemonic_is_scoped_only_in_mnemonic_position():
    names = [n for s in ISA_TABLE.instructions.values() for n in s.names]
    word = next(n for n in names if n.isalpha())
    assert _mnemonics_scoped(f".equ {word.lower()}, 3") == []
    assert _mnemonics_scoped(f"        MMC.SO act, 0, {word.lower()}") == ["MMC"]
    assert _mnemonics_scoped(f"        RW {word}") == ["RW"]
    m = _pattern("mnemonic").match("loop:   HLT   ; HLT again")
    assert (m.group(1), m.group(3)) == ("loop", "HLT")
    assert _mnemonics_scoped("; MMC.SO in a comment") == []
    assert _mnemonics_scoped("x: .equ y, 2") == []


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether `.vscodeignore`'s patterns leave `path` out, as vsce reads them: a pattern
    without a `*` in its last part also covers everything under it (fnmatch's `*` crosses
    `/`, so a shipped file is, if anything, found ignored too often)."""
    import fnmatch
    for pattern in patterns:
        forms = [pattern] if "*" in pattern.rsplit("/", 1)[-1] else [pattern, pattern.rstrip("/") + "/**"]
        for form in forms:
            if fnmatch.fnmatch(path, form) or fnmatch.fnmatch(path, form.replace("**/", "")):
                return True
    return False


def test_the_extension_packages_with_license_and_ignore_file():
    manifest = json.loads((VSCODE / "package.json").read_text())
    license_text = (ROOT / "LICENSE").read_text()
    assert (VSCODE / "LICENSE").read_text() == license_text
    assert manifest["license"] == "MIT" and license_text.startswith("MIT License")
    ignored = [line.strip() for line in (VSCODE / ".vscodeignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    shipped = [manifest["main"], manifest["contributes"]["grammars"][0]["path"],
               manifest["contributes"]["languages"][0]["configuration"], "LICENSE",
               "package.json"]
    for path in shipped:
        assert not _ignored(path.removeprefix("./"), ignored), path
    # bundled into main: the source and the libraries stay out (vsce warns above 100 .js)
    for path in ("extension.js", "node_modules/vscode-languageclient/package.json",
                 "node_modules/vscode-jsonrpc/lib/common/api.js", ".gitignore",
                 "tpuasm-0.1.0.vsix", "dist/extension.js.map"):
        assert _ignored(path, ignored), path


def test_the_extension_is_packaged_by_its_own_script_without_prompts():
    manifest = json.loads((VSCODE / "package.json").read_text())
    scripts = manifest["scripts"]
    # no public address: vsce's repository prompt is answered by the flag, not a made-up URL
    assert "repository" not in manifest
    assert scripts["package"] == "vsce package --allow-missing-repository"
    assert manifest["private"] is True                       # npm publish refuses it
    # vsce runs vscode:prepublish; it bundles extension.js into main with esbuild
    assert scripts["vscode:prepublish"] == "npm run build"
    build = scripts["build"].split()
    assert build[0] == "esbuild" and "--bundle" in build and "--external:vscode" in build
    assert (VSCODE / build[1]).is_file()
    assert f"--outfile={manifest['main'].removeprefix('./')}" in build
    # everything the extension requires is vscode (the editor's) or bundled at build time
    required = re.findall(r"""require\(["']([^"'/]+)""", (VSCODE / build[1]).read_text())
    assert "vscode-languageclient" in required
    assert all(r == "vscode" or r in manifest["devDependencies"] for r in required), required
    assert {"esbuild", "@vscode/vsce"} <= set(manifest["devDependencies"])
    assert "dependencies" not in manifest                  # nothing left to ship unbundled
    assert {"node_modules/", "dist/"} <= set((VSCODE / ".gitignore").read_text().split())


def test_the_setuptools_floor_reads_an_spdx_license():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(project["project"]["license"], str)       # PEP 639: setuptools >= 77
    [floor] = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    version = tuple(int(x) for x in floor.partition(">=")[2].split("."))
    assert version >= (77,)
    assert all((ROOT / f).is_file() for f in project["project"]["license-files"])


def test_every_directive_has_hover_text_and_a_grammar_entry():
    assert set(DOCUMENTED) == set(DIRECTIVES)
    directive = _pattern("directive")
    assert all(directive.fullmatch("." + d) for d in DIRECTIVES)


def test_the_extension_manifest_names_real_files():
    manifest = json.loads((VSCODE / "package.json").read_text())
    assert manifest["main"] == "./dist/extension.js"        # built by `npm run build`
    [language] = manifest["contributes"]["languages"]
    [grammar] = manifest["contributes"]["grammars"]
    assert grammar["language"] == language["id"] and grammar["scopeName"] == "source.tasm"
    assert (VSCODE / grammar["path"]).is_file() and (VSCODE / language["configuration"]).is_file()
    json.loads((VSCODE / language["configuration"]).read_text())
    assert manifest["contributes"]["configuration"]["properties"]["tpuasm.server.command"]["default"] \
        == ["tpuasm", "lsp"]
