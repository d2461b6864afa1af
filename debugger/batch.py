"""`--batch SCRIPT`: the command language without a screen, for CI and grading."""
from __future__ import annotations

import sys

from rich.console import Console

from .commands import Engine, split_script
from .formatting import event_text


def run_batch(session, script: str, name: str = "script", out=None) -> int:
    """Run every command; print results; 1 if any command failed or `expect` did not hold."""
    console = Console(file=out or sys.stdout, highlight=False, soft_wrap=True,
                      force_terminal=False if out is not None else None)
    engine = Engine(session)
    failures = 0
    session.new_events()
    for lineno, line in split_script(script):
        result = engine.execute(line)
        for event in session.new_events():
            if event.kind != "fault":           # a fault is reported by the stop itself
                console.print(event_text(session, event), markup=False)
        for text in result.lines:
            console.print(text)
        if not result.ok:
            failures += 1
            console.print(f"{name}:{lineno}: command failed: {line}", markup=False)
    if failures:
        console.print(f"{failures} command(s) failed", markup=False)
    return 1 if failures else 0
