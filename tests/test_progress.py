"""Progress in a batch job's log: a line every 30 s at most, never one per training step (issue 35).

tqdm's `set_postfix` redraws the bar at once unless given `refresh=False`, whatever its
`mininterval`: the course's loops called it every step, so a Slurm log got one update per step.
wellfno.progress.progress_bar redraws every second on a terminal and every 30 s elsewhere, and
every training loop passes `refresh=False`. An update is a carriage return or a newline written.
"""
import ast
import contextlib
import fcntl
import os
import struct
import tempfile
import termios
import threading
import time

import torch

from tests.conftest import REPO, STEPS, import_script
from wellfno.progress import progress_bar

STEPS_IN_THE_RUN = 300
AT_MOST = 24  # a few dozen: the bar's first and last draw, and one every 30 s in between


def updates(text: str) -> int:
    return text.count("\r") + text.count("\n")


class Doubling(torch.nn.Module):
    """The least a training loop needs of the model: a forward, a loss and parameters."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.scale * x[:, :2]

    def loss(self, prediction, target):
        return torch.nn.functional.mse_loss(prediction, target)


def test_a_training_loop_writes_a_few_lines_to_a_log_not_one_per_step():
    """fno.py's own train_one_epoch, 300 steps, its stderr a file (a Slurm job's log)."""
    fno = import_script(REPO / "fno.py")
    batch = {"input_fields": torch.rand(1, 1, 4, 4, 2), "output_fields": torch.rand(1, 1, 4, 4, 2)}
    model = Doubling()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with tempfile.TemporaryFile("w+") as log:
        with contextlib.redirect_stderr(log):
            row = fno.train_one_epoch(model, [batch] * STEPS_IN_THE_RUN, optimizer,
                                      torch.device("cpu"), 1)
        log.seek(0)
        written = log.read()
    assert row["steps"] == STEPS_IN_THE_RUN
    assert updates(written) <= AT_MOST, (
        f"{updates(written)} progress updates in a log for {STEPS_IN_THE_RUN} steps")
    assert "300/300" in written and "loss=" in written, "the last line shows the end and the loss"


def test_on_a_terminal_the_bar_stays_live():
    """Redrawn about every second on a terminal (a pseudo-terminal here), and the last draw done."""
    main, secondary = os.openpty()
    # 24 rows of 100 columns: a new pseudo-terminal has 0, and tqdm draws the bar to fit
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    terminal, chunks = os.fdopen(secondary, "w"), []

    def read():  # as a terminal does, meanwhile: a pseudo-terminal holds only a few KB
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        bar = progress_bar(range(150), "epoch 1", file=terminal)
        started = time.monotonic()
        for step in bar:
            time.sleep(0.02)
            bar.set_postfix(loss=f"{step:.4f}", refresh=False)
        bar.close()
        seconds = time.monotonic() - started
    finally:
        terminal.close()
        reader.join(timeout=10)
        os.close(main)
    written = b"".join(chunks).decode()
    assert 3 <= updates(written) <= 2 * seconds + 4, (
        f"{updates(written)} redraws on a terminal in {seconds:.1f} s (about one a second)")
    assert "150/150" in written


def test_every_training_loop_uses_the_shared_bar_without_a_redraw_per_step():
    """Every loop: progress_bar (not tqdm itself), and set_postfix(..., refresh=False)."""
    for step, script in STEPS.items():
        tree = ast.parse((REPO / script).read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, (ast.Name, ast.Attribute))]
        named = {node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                 for node in calls}
        builds_tqdm, uses_the_bar = "tqdm" in named, "progress_bar" in named
        assert not builds_tqdm, f"{script}: builds tqdm itself; use wellfno.progress.progress_bar"
        assert uses_the_bar, f"{script}: no progress_bar"
        postfix = [node for node in calls if getattr(node.func, "attr", None) == "set_postfix"]
        for node in postfix:
            refresh = {k.arg: k.value for k in node.keywords}.get("refresh")
            assert isinstance(refresh, ast.Constant) and refresh.value is False, (
                f"{script}, line {node.lineno}: set_postfix without refresh=False redraws the bar "
                f"at every step")
