"""The training loop's progress bar: live on a terminal, a line now and then in a job's log.

tqdm redraws its bar at most every `mininterval` seconds, except when the loop asks it to:
`set_postfix(...)` redraws at once unless given `refresh=False`. Called every step, as the
course's loops do to show the loss, it wrote one update per training step into a Slurm job's
log (several a second). So the loops pass `refresh=False` (the loss shows at the next redraw),
and where stderr is not a terminal (a batch job's log, a pipe) the bar is redrawn at most every
LOG_INTERVAL seconds, at the width of a log line, not the terminal's.
"""
from __future__ import annotations

import sys
from typing import Iterable, TextIO

from tqdm import tqdm

TERMINAL_INTERVAL = 1.0  # seconds between redraws on a terminal: a live bar
LOG_INTERVAL = 30.0  # seconds between lines in a log: a job of hours stays readable
LOG_WIDTH = 100  # characters of a log line (no terminal to ask)


def progress_bar(iterable: Iterable, desc: str, disable: bool = False,
                 file: TextIO | None = None) -> tqdm:
    """tqdm over `iterable`, redrawn every second on a terminal, every 30 s elsewhere."""
    file = sys.stderr if file is None else file  # tqdm's default, looked up at each call
    on_terminal = bool(getattr(file, "isatty", lambda: False)())
    if on_terminal:
        return tqdm(iterable, desc=desc, disable=disable, file=file,
                    mininterval=TERMINAL_INTERVAL, dynamic_ncols=True)
    # maxinterval: tqdm's monitor thread would otherwise force a redraw every 10 s
    return tqdm(iterable, desc=desc, disable=disable, file=file, mininterval=LOG_INTERVAL,
                maxinterval=LOG_INTERVAL, ncols=LOG_WIDTH)
