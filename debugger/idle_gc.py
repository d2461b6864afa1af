"""Full garbage collections while the user is idle, not in the middle of a step.

Why.  Textual leaves thousands of cyclic objects behind per repaint (messages, events,
strip caches), and CPython's automatic full collection walks every tracked object the
session keeps (~45k in a session after a few dozen steps): measured 35-130 ms each, several
per 40 steps, which alone put the step latency's p95 at ~100 ms (bench_debugger.py).  So
while the app runs, the young generations are still collected automatically (cheap), the
objects alive at start-up are frozen out of the collector's sight (gc.freeze), and the full
collection runs from a timer once no key has come for IDLE_SECONDS.
"""
from __future__ import annotations

import gc
import time

IDLE_SECONDS = 0.5


class IdleCollector:
    def __init__(self):
        self._thresholds: tuple[int, int, int] | None = None
        self._last = 0.0
        self._pending = False

    def start(self, app) -> None:
        """Freeze what is alive now, stop automatic full collections, check for idleness
        twice per IDLE_SECONDS."""
        gc.freeze()
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, 1 << 30)
        app.set_interval(IDLE_SECONDS / 2, self._tick)

    def activity(self) -> None:
        """A key or a command: garbage is coming, and now is not the time to collect it."""
        self._last = time.monotonic()
        self._pending = True

    def _tick(self) -> None:
        if self._pending and time.monotonic() - self._last >= IDLE_SECONDS:
            self._pending = False
            gc.collect()

    def stop(self) -> None:
        """Hand everything back (tests start many apps in one process)."""
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        gc.unfreeze()
