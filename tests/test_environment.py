"""tpuasm.environment: one typed table of every environment variable tpuasm reads, rendered
into spec/environment.md.  The doc regenerates from the table; this test fails when they
drift, when the code names a TPUASM_ variable (or reads any variable) the table lacks, and
when a row's "read in" column is not where the code reads it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import tpuasm
from tpuasm import environment

ROOT = Path(tpuasm.__file__).resolve().parent.parent
CODE = sorted([*ROOT.joinpath("tpuasm").rglob("*.py"), *ROOT.joinpath("debugger").rglob("*.py")])
OWN = ROOT / "tpuasm" / "environment.py"


def _named(name: str) -> set[str]:
    """Modules (other than the table's) that hold the variable's name as a string."""
    pattern = re.compile(rf"""["']{re.escape(name)}["']""")
    return {p.relative_to(ROOT).as_posix() for p in CODE
            if p != OWN and pattern.search(p.read_text(encoding="utf-8"))}


def test_spec_is_in_sync_with_the_table():
    assert environment.main(["--check"]) == 0, "run `python -m tpuasm.environment`"


def test_a_changed_row_makes_the_spec_stale(monkeypatch):
    text = environment.SPEC.read_text(encoding="utf-8")
    assert environment.render(text) == text
    changed = environment.VARIABLES[0].__class__(
        **{**environment.VARIABLES[0].__dict__, "default": "something else"})
    monkeypatch.setattr(environment, "VARIABLES", (changed, *environment.VARIABLES[1:]))
    assert environment.render(text) != text
    assert environment.main(["--check"]) == 1


def test_every_tpuasm_variable_named_in_the_code_is_in_the_table():
    names = set()
    for p in CODE:
        names |= set(re.findall(r"""["'](TPUASM_[A-Z0-9_]+)["']""", p.read_text("utf-8")))
    assert names and names <= set(environment.BY_NAME), names - set(environment.BY_NAME)


def test_the_code_reads_the_environment_only_through_the_table():
    direct = re.compile(r"os\.environ\.get\(|os\.environ\[|os\.getenv\(|environ\.get\(")
    offenders = [p.relative_to(ROOT).as_posix() for p in CODE
                 if p != OWN and direct.search(p.read_text("utf-8"))]
    assert offenders == []


@pytest.mark.parametrize("variable", environment.VARIABLES, ids=lambda v: v.name)
def test_read_in_names_where_the_code_reads_it(variable):
    assert _named(variable.name) == set(variable.read_in)
    assert variable.kind in ("flag", "int", "size", "text", "choice", "path", "command")
    assert variable.effect.strip() and variable.default.strip()


def test_an_unknown_name_is_refused():
    with pytest.raises(KeyError, match="TPUASM_NOPE"):
        environment.raw("TPUASM_NOPE")


def test_raw_reads_the_environment(monkeypatch):
    monkeypatch.setenv("TPUASM_INT8_THREADS", "3")
    assert environment.raw("TPUASM_INT8_THREADS") == "3"
    monkeypatch.delenv("TPUASM_INT8_THREADS")
    assert environment.raw("TPUASM_INT8_THREADS") is None
