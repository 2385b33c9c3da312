"""Best of N: measure every configuration N times, round-robin, and keep each one's fastest round.

Interference (another process, a page-cache miss, a frequency drop) only ever slows a run down, so
the fastest of a few rounds is the closest to what the code itself costs; round-robin (every
configuration once, then every one again) spreads a burst of interference over all of them
instead of one configuration's rounds.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

Run = TypeVar("Run")


def best_of_rounds(runs: Sequence[Run], measure: Callable[[Run], dict], repeats: int,
                   seconds: Callable[[dict], float]) -> list[dict]:
    """`measure(run)` for every run, `repeats` rounds; for each run the row whose `seconds(row)`
    is smallest, with `rounds` (how many it was the best of) added."""
    best: list[dict | None] = [None] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            row = measure(run)
            if best[i] is None or seconds(row) < seconds(best[i]):
                best[i] = row
    return [dict(row, rounds=repeats) for row in best]
