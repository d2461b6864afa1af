"""Presenting results: failure text, the summary table and JUnit XML."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from .runner import Result

# Characters XML 1.0 cannot carry (and ANSI escapes, which mean nothing in a report).
_XML_BAD = re.compile(r"\x1b\[[0-9;]*m|[\x00-\x08\x0b\x0c\x0e-\x1f]")


def failure_text(result: Result) -> str:
    """Why a result did not pass: one paragraph per failed expectation."""
    head = f"{result.name} ({result.path}): {result.outcome.upper()}"
    if result.fault and not any(result.fault in f for f in result.failures):
        head += f"\n  machine: {result.fault}"
    if result.cycles is not None:
        head += f"\n  ran {result.cycles:,} cycles"
    body = "\n".join(f"- {_indent(f)}" for f in result.failures)
    return f"{head}\n{body}" if body else head


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def summary_table(results: list[Result]):
    from rich.table import Table
    table = Table(title="tpuasm regression", title_justify="left")
    table.add_column("program")
    table.add_column("result")
    table.add_column("cycles", justify="right")
    table.add_column("bound", justify="right")
    table.add_column("wall", justify="right")
    style = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "error": "[red]ERROR[/]"}
    for r in results:
        cycles = f"{r.cycles:,}" if r.cycles is not None else (
            "asm error" if r.status == "assembly_error" else "-")
        table.add_row(r.name, style[r.outcome], cycles, r.bound, f"{r.wall:.2f} s")
    return table


def totals_line(results: list[Result], seconds: float) -> str:
    passed = sum(r.passed for r in results)
    failed = sum(r.outcome == "fail" for r in results)
    errors = sum(r.outcome == "error" for r in results)
    parts = [f"{passed} passed"]
    if failed:
        parts.append(f"{failed} failed")
    if errors:
        parts.append(f"{errors} errors")
    return ", ".join(parts) + f" in {seconds:.1f} s"


def _clean(text: str) -> str:
    return _XML_BAD.sub("", text)


def junit_xml(results: list[Result], seconds: float) -> bytes:
    """JUnit XML (one testsuite), as read by CI systems."""
    suite = ET.Element("testsuite", {
        "name": "tpuasm-regression",
        "tests": str(len(results)),
        "failures": str(sum(r.outcome == "fail" for r in results)),
        "errors": str(sum(r.outcome == "error" for r in results)),
        "skipped": "0",
        "time": f"{seconds:.3f}",
    })
    for r in results:
        case = ET.SubElement(suite, "testcase", {
            "classname": _classname(r.path), "name": r.name, "time": f"{r.wall:.3f}"})
        if not r.passed:
            tag = "failure" if r.outcome == "fail" else "error"
            first = r.failures[0].splitlines()[0] if r.failures else r.outcome
            node = ET.SubElement(case, tag, {"message": _clean(first), "type": r.outcome})
            node.text = _clean(failure_text(r))
        props = [f"cycles={r.cycles}"] if r.cycles is not None else []
        props += [f"{k}={v}" for k, v in sorted(r.counters.items())]
        if props:
            ET.SubElement(case, "system-out").text = _clean("\n".join(props))
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def _classname(path: str) -> str:
    """programs/mlp0/test.toml -> programs.mlp0 (relative to the cwd when possible)."""
    p = Path(path).parent
    try:
        p = p.relative_to(Path.cwd())
    except ValueError:
        pass
    return ".".join(part for part in p.parts if part not in ("/", "")) or "tpuasm"
