"""wellfno.watchdog: one failing or dead rank ends every rank within seconds, and one line names it.

The unit tests run several "ranks" as threads of this process, sharing one in-memory store
(torch's HashStore, the same interface as the TCPStore of a process group), with short
timings; the hard exit is recorded instead of ending the test. The last tests run real
process groups (gloo) with a training-like loop of all_reduce steps.
"""
from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from wellfno.cli import UserError
from wellfno.watchdog import PeerFailed, Watchdog, describe, is_communication_error, odd_ranks

FAST = dict(heartbeat_s=0.05, dead_after_s=0.6, grace_s=0.3)


class TimedText(io.StringIO):
    """A rank's stderr that remembers when something was first written to it."""

    first_write = None

    def write(self, text):
        if text and self.first_write is None:
            self.first_write = time.monotonic()
        return super().write(text)


class Rank:
    """One simulated rank: a watchdog with a recorded hard exit and its own output."""

    def __init__(self, rank, world, store, **kwargs):
        self.out = TimedText()
        self.killed = threading.Event()  # set by the watchdog's hard exit
        self.exit_codes = []
        self.outcome = None  # "ok", ("exit", code) or the exception that left the rank
        self.ended_at = None

        def hard_exit(code):
            self.exit_codes.append(code)
            self.ended_at = time.monotonic()
            self.killed.set()

        self.watchdog = Watchdog(rank, world, store, hard_exit=hard_exit, out=self.out, **{**FAST, **kwargs})

    def run(self, body):
        try:
            with self.watchdog as wd:
                body(wd, self)
            self.outcome = "ok"
        except SystemExit as err:
            self.outcome = ("exit", err.code)
        except BaseException as err:  # noqa: BLE001 - recorded for the test
            self.outcome = err
        self.ended_at = self.ended_at or time.monotonic()

    @property
    def left_with_an_error(self):
        """It ended with a non-zero code: under srun --kill-on-bad-exit=1 its exit ends every other rank."""
        return bool(self.exit_codes) or (self.outcome is not None and self.outcome != "ok"
                                         and self.outcome not in (("exit", 0), ("exit", None)))


class SlowToLearn:
    """The store as one rank's watchdog thread sees it on a busy machine: its first read of the
    posted failure comes `delay` s late (the thread was descheduled; its heartbeat stops meanwhile)."""

    def __init__(self, store, delay):
        self._store, self._delay = store, delay

    def get(self, key):
        if key.endswith("/failed") and self._delay:
            time.sleep(self._delay)
            self._delay = 0
        return self._store.get(key)

    def __getattr__(self, name):
        return getattr(self._store, name)


def run_ranks(bodies, slow_to_learn=(), **kwargs):
    """Run one body per rank in threads; return the Ranks and the start time.

    slow_to_learn: {rank: delay}: that rank's watchdog reads the posted failure `delay` s late."""
    store = dist.HashStore()
    ranks = [Rank(r, len(bodies), SlowToLearn(store, dict(slow_to_learn).get(r, 0)), **kwargs)
             for r in range(len(bodies))]
    threads = [threading.Thread(target=rank.run, args=(body,)) for rank, body in zip(ranks, bodies) if body]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a simulated rank hung"
    return ranks, started


def train(steps=1000, step_s=0.01):
    def body(wd, rank):
        for _ in range(steps):
            time.sleep(step_s)  # "compute"
            wd.step()
    return body


def die(wd):
    """Like os._exit for this simulated rank: the heartbeat stops, nothing is posted, no 'done'."""
    wd._stop.set()
    wd._thread.join()
    wd._thread = None


def lines(ranks):
    return [line for r in ranks for line in r.out.getvalue().splitlines()]


def test_a_rank_that_raises_ends_every_rank_and_one_line_names_it():
    def failing(wd, rank):
        time.sleep(0.2)
        raise ValueError("boom in the data")

    ranks, started = run_ranks([train(), failing, train()])
    assert isinstance(ranks[1].outcome, ValueError)  # the failing rank's own error goes on, as usual
    assert ranks[0].outcome == ("exit", 1) and ranks[2].outcome == ("exit", 1)
    assert max(r.ended_at for r in ranks) - started < 2.0
    assert lines(ranks) == ["error: rank 1 failed: ValueError: boom in the data; stopped all 3 ranks"]
    assert lines(ranks) == [ranks[0].out.getvalue().strip()]  # printed by rank 0 only
    assert not any(r.exit_codes for r in ranks)  # every main thread noticed by itself


def test_a_user_error_is_quoted_as_is_and_rank_1_reports_when_rank_0_fails():
    def failing(wd, rank):
        raise UserError("cannot read part_1.hdf5; generate it again")

    ranks, _ = run_ranks([failing, train()])
    assert lines(ranks) == ["error: rank 0 failed: cannot read part_1.hdf5; generate it again; stopped all 2 ranks"]
    assert ranks[1].out.getvalue() and ranks[1].outcome == ("exit", 1)


def test_a_rank_that_dies_silently_is_named_within_dead_after():
    def dies(wd, rank):
        time.sleep(0.2)
        die(wd)

    ranks, started = run_ranks([train(), dies, train(), train()])
    survivors = [ranks[0], ranks[2], ranks[3]]
    assert all(r.outcome == ("exit", 1) for r in survivors)
    assert max(r.ended_at for r in survivors) - started < 0.2 + FAST["dead_after_s"] + 1.0
    assert len(lines(ranks)) == 1
    assert re.fullmatch(r"error: rank 1 stopped responding \(no heartbeat for \d+ s\): .*; stopped all 4 ranks",
                        lines(ranks)[0])


def test_a_rank_blocked_in_a_collective_is_ended_by_its_thread():
    """The main thread cannot notice while it waits in a collective: the watchdog thread ends the process."""
    def blocked(wd, rank):
        rank.killed.wait(10)  # a collective that never returns; "os._exit" releases it

    def failing(wd, rank):
        time.sleep(0.1)
        raise RuntimeError("CUDA error: an illegal memory access")

    ranks, started = run_ranks([blocked, failing])
    assert ranks[0].exit_codes == [1]
    assert ranks[0].ended_at - started < 0.1 + FAST["grace_s"] + 1.0
    assert lines(ranks) == ["error: rank 1 failed: RuntimeError: CUDA error: an illegal memory access; "
                            "stopped all 2 ranks"]


def test_a_collective_error_from_a_dead_peer_blames_the_peer():
    """gloo raises 'Connection reset by peer' at once; the heartbeats name the dead rank a little later."""
    def sees_reset(wd, rank):
        time.sleep(0.2)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:28550: Connection reset by peer")

    def dies(wd, rank):
        time.sleep(0.15)
        die(wd)

    ranks, _ = run_ranks([sees_reset, dies, train()])
    assert ranks[0].outcome == ("exit", 1)
    assert len(lines(ranks)) == 1 and lines(ranks)[0].startswith("error: rank 1 stopped responding")


# --------------------------------------------------------------------------- the line before any exit
# Under srun --kill-on-bad-exit=1 (07_failures_2nodes.sbatch; torchrun alike) the first task that
# exits non-zero has the whole step terminated at once. The line must be out by then, however late
# the reporting rank learns of the failure. Each test below makes the reporter learn late (its
# watchdog thread descheduled for 0.6 s, as on a busy 2-core machine), which a fixed wait of
# grace_s (0.3 s) in the other ranks lost every time: the job ended with no line naming the rank.
LATE = dict(heartbeat_s=0.05, dead_after_s=1.5, grace_s=0.3)


def test_a_lost_node_is_named_before_any_rank_leaves_when_the_reporter_learns_late():
    """07_failures_2nodes's lost node: ranks 2 and 3 vanish, the collectives of ranks 0 and 1 fail
    at once with gloo's reset; rank 1 (watching rank 2) names it; rank 0 prints the line."""
    node_lost = threading.Event()

    def survivor(wd, rank):
        node_lost.wait(5)
        time.sleep(0.05)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:4242: Connection reset by peer")

    def on_the_lost_node(wd, rank):
        time.sleep(0.2)
        die(wd)
        node_lost.set()

    ranks, _ = run_ranks([survivor, survivor, on_the_lost_node, on_the_lost_node], slow_to_learn={0: 0.6}, **LATE)
    assert ranks[0].outcome == ("exit", 1) and ranks[1].outcome == ("exit", 1)
    assert len(lines(ranks)) == 1 and lines(ranks)[0].startswith("error: rank 2 stopped responding"), lines(ranks)
    assert lines(ranks) == [ranks[0].out.getvalue().strip()]
    first_exit = min(r.ended_at for r in ranks[1:2])  # srun ends the step when rank 1 leaves
    assert ranks[0].out.first_write < first_exit, "rank 1 left (and srun ended rank 0) before the line"


@pytest.mark.parametrize("failing", [1, 0])
def test_a_failing_rank_leaves_only_after_the_line_is_out(failing):
    """The rank that raised exits 1 with its own error; that exit ends the reporter under srun -K,
    so it waits for the reporter's line (rank 0's, or rank 1's when rank 0 failed: the store's host)."""
    reporter = 1 if failing == 0 else 0

    def raises(wd, rank):
        time.sleep(0.2)
        raise ValueError("loss is nan")

    bodies = [train(), train(), train()]
    bodies[failing] = raises
    ranks, _ = run_ranks(bodies, slow_to_learn={reporter: 0.6}, **LATE)
    assert isinstance(ranks[failing].outcome, ValueError)
    assert lines(ranks) == [f"error: rank {failing} failed: ValueError: loss is nan; stopped all 3 ranks"]
    assert ranks[reporter].out.first_write is not None
    first_exit = min(r.ended_at for r in ranks if r.left_with_an_error and r is not ranks[reporter])
    assert ranks[reporter].out.first_write < first_exit, "a rank left (and srun ended the reporter) before the line"


def test_every_rank_failing_its_own_check_prints_its_own_error_and_waits_for_nobody():
    """An argument check every rank makes after init_process_group (step 13's --modes): each rank
    raises the same UserError, each prints it itself (no 'stopped all' line on top), and none
    waits for a line that nobody owes (the reporter marks its say done)."""
    both = threading.Barrier(2)

    def refuses(wd, rank):
        time.sleep(0.2)  # after the watchdog threads' first look, long before their next (5 s):
        both.wait()      # the main threads alone decide, as when both raise within milliseconds
        raise UserError("--modes keeps 1 Fourier modes, fewer than the 2 domain ranks")

    slow = dict(heartbeat_s=5.0, dead_after_s=20.0, grace_s=0.3)
    ranks, started = run_ranks([refuses, refuses], **slow)
    assert all(isinstance(r.outcome, UserError) for r in ranks), [r.outcome for r in ranks]
    assert lines(ranks) == []
    assert max(r.ended_at for r in ranks) - started < 2.0  # nobody waited out the reporter's heartbeat


def test_wait_for_all_waits_without_a_time_limit_and_is_not_a_stall():
    arrived = {}

    def worker(delay):
        def body(wd, rank):
            for _ in range(round(delay / 0.05)):  # working: steps keep coming
                time.sleep(0.05)
                wd.step()
            wd.wait_for_all()
            arrived[wd.rank] = time.monotonic()
            wd.wait_for_all()  # a second barrier reuses nothing of the first
        return body

    # stall_after shorter than the wait: waiting at the barrier does not count as hanging
    ranks, started = run_ranks([worker(0.0), worker(0.0), worker(1.2)], stall_after_s=0.8)
    assert [r.outcome for r in ranks] == ["ok"] * 3, [r.outcome for r in ranks]
    assert min(arrived.values()) - started >= 1.2  # nobody left before the slowest arrived
    assert lines(ranks) == []


def test_a_failure_while_others_wait_at_the_barrier_ends_them():
    def waits(wd, rank):
        wd.wait_for_all()

    def failing(wd, rank):
        time.sleep(0.3)
        raise OSError("disk quota exceeded")

    ranks, started = run_ranks([waits, waits, failing])
    assert ranks[0].outcome == ("exit", 1) and ranks[1].outcome == ("exit", 1)
    assert lines(ranks) == ["error: rank 2 failed: OSError: disk quota exceeded; stopped all 3 ranks"]


def test_a_stalled_rank_is_named():
    def hangs(wd, rank):
        for _ in range(3):
            time.sleep(0.05)
            wd.step()
        rank.killed.wait(10)  # then no step(): stuck in a read that never returns

    ranks, _ = run_ranks([train(), hangs], stall_after_s=0.5)
    assert ranks[1].exit_codes == [1] and ranks[0].outcome == ("exit", 1)
    assert len(lines(ranks)) == 1 and lines(ranks)[0].startswith("error: rank 1 made no progress for")


def test_a_long_start_before_the_first_step_is_not_a_stall():
    def slow_start(wd, rank):
        time.sleep(1.0)  # planning thousands of files, compiling: longer than stall_after_s
        for _ in range(3):
            time.sleep(0.05)
            wd.step()
        wd.wait_for_all()

    def fast(wd, rank):
        wd.step()
        wd.wait_for_all()

    ranks, _ = run_ranks([fast, slow_start], stall_after_s=0.4)
    assert [r.outcome for r in ranks] == ["ok", "ok"] and lines(ranks) == []


def test_the_first_failure_wins():
    def first(wd, rank):
        time.sleep(0.1)
        raise ValueError("first")

    def second(wd, rank):
        time.sleep(0.25)
        raise ValueError("second")

    ranks, _ = run_ranks([train(), first, second], heartbeat_s=0.5, dead_after_s=2.0)
    assert isinstance(ranks[1].outcome, ValueError)
    assert lines(ranks) == ["error: rank 1 failed: ValueError: first; stopped all 3 ranks"]


def test_clean_runs_say_nothing_and_rank_0_leaves_last():
    """Ranks that finish at different times are not taken for dead; rank 0 (the store's host) waits for all."""
    def finish_after(delay):
        def body(wd, rank):
            time.sleep(delay)
        return body

    ranks, _ = run_ranks([finish_after(0.0), finish_after(0.3), finish_after(1.5)])  # 1.5 s > dead_after
    assert [r.outcome for r in ranks] == ["ok"] * 3
    assert lines(ranks) == [] and not any(r.exit_codes for r in ranks)
    assert ranks[0].ended_at >= ranks[2].ended_at - 0.05


def test_a_rank_that_dies_while_rank_0_waits_at_the_end_is_named():
    def finished(wd, rank):
        pass

    def dies_late(wd, rank):
        for _ in range(6):
            time.sleep(0.05)
            wd.step()
        die(wd)  # before it is done

    ranks, _ = run_ranks([finished, finished, dies_late])
    assert ranks[0].outcome == ("exit", 1)
    assert len(lines(ranks)) == 1 and lines(ranks)[0].startswith("error: rank 2 stopped responding")


def test_one_process_does_nothing():
    wd = Watchdog(0, 1, hard_exit=pytest.fail)
    with pytest.raises(ValueError):
        with wd:
            wd.step()
            wd.wait_for_all()
            raise ValueError("propagates unchanged")
    assert wd.failure is None


def test_helpers():
    assert odd_ranks([[3, 4], [3, 4], [3, 5], [3, 4]]) == [2]
    assert odd_ranks([[1], [1]]) == []
    assert describe(UserError("say what to do")) == "say what to do"
    assert describe(OSError("read failed\nmore")) == "OSError: read failed"
    assert is_communication_error(RuntimeError("pair.cc: Connection reset by peer"))
    assert is_communication_error(dist.DistNetworkError("Broken pipe"))
    assert not is_communication_error(RuntimeError("shape mismatch"))
    with pytest.raises(ValueError):
        Watchdog(2, 2)
    assert str(PeerFailed(3, "failed: x")) == "rank 3 failed: x"


# --------------------------------------------------------------------------- real process groups
LOOP = r'''
import os, sys, time, datetime, torch, torch.distributed as dist
from wellfno.cli import run_main
from wellfno.launch import launch_environment
from wellfno.watchdog import Watchdog, check_same_on_every_rank

def main():
    env = launch_environment()
    env.export_rendezvous()
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=120))
    mode, bad = os.environ["MODE"], int(os.environ["BAD_RANK"])
    with Watchdog(env.rank, env.world_size, heartbeat_s=0.2, dead_after_s=2.0, grace_s=1.0) as wd:
        if mode == "mismatch":
            check_same_on_every_rank([7, 8 + (env.rank == bad)], "config", "; use one config file")
        for step in range(60):
            if env.rank == bad and step == 5:
                if mode == "raise":
                    raise RuntimeError("loss is nan at step 5")
                if mode == "die":
                    os._exit(9)
            grad = torch.ones(4)
            dist.all_reduce(grad)  # a data-parallel step's gradient sync
            time.sleep(0.02)
            wd.step()
        wd.wait_for_all()
    dist.destroy_process_group()
    return 0

run_main(main)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "die", "mismatch", "none"])
def test_training_loop_under_a_real_process_group(tmp_path, mode):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    world, bad, port = 3, 1, free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC"))}
    procs = []
    started = time.monotonic()
    for rank in range(world):
        procs.append(subprocess.Popen(
            [sys.executable, str(script)], cwd=Path(__file__).resolve().parents[1],
            env={**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "MODE": mode, "BAD_RANK": str(bad),
                 "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        try:
            results.append((p.wait(timeout=90), p.stderr.read()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung")
    elapsed = time.monotonic() - started
    codes = [rc for rc, _ in results]
    stderr = "".join(err for _, err in results)
    if mode == "none":
        assert codes == [0] * world, stderr
        assert "error" not in stderr
        return
    assert codes[0] == 1 and codes[2] == 1, (codes, stderr)
    naming = [line for line in stderr.splitlines() if line.endswith("stopped all 3 ranks")]
    assert len(naming) == 1, stderr
    assert naming[0].startswith("error: rank 1 ")
    assert "Traceback" not in results[0][1] + results[2][1]  # the survivors: one line, no traceback
    if mode == "raise":
        assert codes[1] == 1 and "loss is nan" in naming[0]
    elif mode == "die":
        assert codes[1] == 9 and "stopped responding" in naming[0]
    else:
        assert codes[1] == 2 and "error: rank 1 sees a different config than rank 0; use one config file\n" in stderr
    assert elapsed < 60  # torch imports on a busy 2-core machine; the watchdog itself needs seconds
