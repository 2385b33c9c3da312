"""When one rank fails, every rank stops within seconds, and one line says which rank.

Without help, a parallel job whose rank raised or died leaves the others waiting in their next
collective until the process group's timeout (minutes) or the job's time limit (hours). Slurm
can end a step when a task exits non-zero (`srun --kill-on-bad-exit=1`) and torchrun stops the
workers of its node when one fails; neither says which rank it was, and neither helps ranks
started some other way. This module does it inside the program, through the key-value store
that every torch.distributed process group already has:

    with Watchdog(env.rank, env.world_size) as watchdog:   # after init_process_group
        for batch in loader:
            ...                                            # collectives as usual
            watchdog.step()                                # progress; raises PeerFailed if a rank failed
        watchdog.wait_for_all()                            # store barrier with no time limit while all are alive

- A rank that raises: leaving the `with` block posts "rank R failed: <error>" in the store
  (the first failure wins) and re-raises, so the rank prints its own error as usual.
- A rank that dies silently (killed, out of memory, node lost): each rank's background thread
  increments a heartbeat counter every `heartbeat_s` and watches the next rank's counter
  (a ring: rank r watches r + 1). A counter that stops for `dead_after_s` is posted as
  "rank R stopped responding". A store that stops answering means its host died (rank 0 under
  srun/env://).
- Every other rank learns of a failure within `heartbeat_s`: `step()`, `check()` and
  `wait_for_all()` raise PeerFailed; a rank blocked in a collective (where Python cannot
  interrupt it) is ended by its watchdog thread after `grace_s`. Either way the process exits
  with code 1, and exactly one rank (rank 0, or rank 1 when rank 0 failed) prints one line:
  "error: rank 1 failed: OSError: ...; stopped all 4 ranks".
- The line comes out before any rank ends. Under `srun --kill-on-bad-exit=1` (and torchrun) the
  first task that exits non-zero has every other task of the step terminated at once, in whatever
  Python code it is, so a reporter that is still waiting never prints. The reporter therefore
  prints the moment it learns of the failure, from whichever of its threads learns it, before it
  waits for anything; every other rank, the failed one included, leaves only once the reporter
  has posted "reported" in the store, or the reporter's heartbeat stopped for `dead_after_s`
  (it is gone too), or the store is gone.
- Optionally, a rank whose main thread made progress (`step()`) and then makes none for
  `stall_after_s`, outside `wait_for_all()`, is posted as stalled (it hangs in I/O, or in a
  collective waiting for a rank that hangs). The clock starts at the first `step()`, so a long
  start (opening thousands of files, compiling) is never taken for a hang.

- A collective that fails because its peer vanished (gloo: "Connection reset by peer", at once)
  is not blamed on this rank: leaving the `with` block with such an error waits up to
  `dead_after_s` for the heartbeats to name the rank that died.

Costs: about 4 small store requests per rank per `heartbeat_s`; nothing on the collectives.
A training loop's `step()` only reads a flag. With one process (world size 1) everything here
does nothing. When the store's host dies, torch's C++ client logs a warning on each rank before
the line; TORCH_CPP_LOG_LEVEL=ERROR in the environment silences it.

Sources: srun's --kill-on-bad-exit, https://slurm.schedmd.com/srun.html#OPT_kill-on-bad-exit
(srun's launch/slurm plugin signals the whole step with SIG_TERM_KILL as soon as one task exits
non-zero: SIGCONT, SIGTERM, then SIGKILL after the cluster's KillWait; the job log's
"_step_signal: Terminating StepId=..." line);
torchrun's agent tears down its workers when one fails,
https://docs.pytorch.org/docs/stable/elastic/agent.html; the store API (add, check,
compare_set), https://docs.pytorch.org/docs/stable/distributed.html#distributed-key-value-store
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from wellfno.cli import UserError

# Messages of errors that a collective raises when its peer process is gone (gloo's TCP pairs,
# the store's socket, NCCL's communicator): the peer's failure explains them, not this rank's.
PEER_LOSS_HINTS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket Timeout",
                   "NCCL communicator was aborted", "ncclRemoteError", "Connection refused")


class PeerFailed(Exception):
    """Another rank failed, died or stalled: this rank stops. `rank` is that rank's number."""

    def __init__(self, rank: int, reason: str):
        self.rank, self.reason = rank, reason
        super().__init__(f"rank {rank} {reason}")


def describe(exc: BaseException) -> str:
    """One line for an exception: a UserError's message as is, else 'Type: first line'."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, UserError):
        return text
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def is_communication_error(exc: BaseException) -> bool:
    """True for errors a collective or the store raises when a peer process went away."""
    try:
        from torch.distributed import DistError
    except ImportError:  # torch built without distributed support
        DistError = ()  # noqa: N806
    return isinstance(exc, DistError) or (isinstance(exc, RuntimeError)
                                          and any(hint in str(exc) for hint in PEER_LOSS_HINTS))


def default_store():
    """The key-value store of the default process group (created by init_process_group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("Watchdog needs torch.distributed.init_process_group first (or a store)")
    return dist.distributed_c10d._get_default_store()


class Watchdog:
    """Failure and liveness signals between ranks through a torch.distributed store (see the module text).

    rank, world_size: this process's place (`wellfno.launch.launch_environment()`).
    store:         a torch.distributed Store shared by all ranks; default: the default process group's.
    heartbeat_s:   how often the background thread beats and looks for failures.
    dead_after_s:  a rank whose heartbeat has not moved for this long is declared dead.
    stall_after_s: None, or: a rank that called `step()` once, then none for this long (outside
                   `wait_for_all`), is stalled.
    grace_s:       after a failure is known, how long the main thread has to notice it itself
                   (`step`, `check`, `wait_for_all`) before the thread ends the process.
    name:          key prefix, so that two watchdogs in one process group do not meet.
    """

    def __init__(self, rank: int, world_size: int, store=None, *, heartbeat_s: float = 1.0,
                 dead_after_s: float = 10.0, stall_after_s: float | None = None, grace_s: float = 2.0,
                 name: str = "wellfno_watchdog", exit_code: int = 1,
                 hard_exit: Callable[[int], object] = os._exit, out: TextIO | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if dead_after_s <= heartbeat_s:
            raise ValueError("dead_after_s must be longer than heartbeat_s")
        self.rank, self.world_size = rank, world_size
        self.heartbeat_s, self.dead_after_s, self.stall_after_s = heartbeat_s, dead_after_s, stall_after_s
        self.grace_s, self.name, self.exit_code = grace_s, name, exit_code
        self._hard_exit, self._out = hard_exit, out
        self._store = store
        self._failure: PeerFailed | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress_time: float | None = None  # monotonic time of the last step(); None before the first
        self._waiting = False
        self._barriers = 0
        self._reported = False
        self._report_lock = threading.Lock()  # the main thread and the watchdog thread may both learn at once

    # ------------------------------------------------------------------ public API
    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def failure(self) -> PeerFailed | None:
        """The first failure this rank knows of (None while all is well)."""
        return self._failure

    def start(self) -> "Watchdog":
        if self.active and self._thread is None:
            if self._store is None:
                self._store = default_store()
            try:  # which node this rank runs on, for the line that names a dead rank
                self._store.set(self._key(f"node/{self.rank}"), node_name())
            except Exception:  # noqa: BLE001 - a store without set: the line names no node
                pass
            self._thread = threading.Thread(target=self._watch, name=f"watchdog-rank{self.rank}", daemon=True)
            self._thread.start()
        return self

    def step(self) -> None:
        """The main thread made progress (an item, a training step); raises PeerFailed if a rank failed."""
        self._progress_time = time.monotonic()
        self.check()

    def check(self) -> None:
        """Raise PeerFailed if any rank failed (reads a flag the background thread sets: no communication)."""
        if self._failure is not None:
            raise self._failure

    def wait_for_all(self) -> None:
        """Barrier through the store: returns when every rank got here, raises PeerFailed when one failed.

        No time limit while every rank is alive, unlike a collective (which gives up after the
        process group's timeout): ranks that finish their share early can wait for slow ones.
        Every rank must call it the same number of times.
        """
        if not self.active:
            return
        self._barriers += 1
        key = self._key(f"barrier{self._barriers}")
        self._waiting = True
        try:
            self._store.add(key, 1)
            pause = min(0.05, self.heartbeat_s)
            while True:
                self.check()
                if self._store.add(key, 0) >= self.world_size:
                    break
                time.sleep(pause)
                pause = min(pause * 1.5, self.heartbeat_s / 2)
        except PeerFailed:
            raise
        except Exception as err:  # noqa: BLE001 - the store went away: its host died
            self._record(self._lost_store(err))
            raise self._failure from None
        finally:
            self._waiting = False
            if self._progress_time is not None:
                self._progress_time = time.monotonic()

    def fail(self, reason: str) -> PeerFailed:
        """Post this rank's own failure ("rank R failed: reason"); the first failure posted wins."""
        return self._post(self.rank, f"failed: {reason}")

    def stop(self) -> None:
        """Say this rank is done (so nobody takes its silence for death) and stop the thread.

        Rank 0 leaves last: under srun/env:// the store lives in its process, and a rank still
        running would lose it. It waits for every rank to be done, or declared dead, or, once a
        failure is known, for grace_s at most.
        """
        if self._thread is None:
            return
        try:
            self._store.set(self._key(f"done/{self.rank}"), "1")
            self._store.add(self._key("done"), 1)
            if self.rank == 0:
                self._linger()
        except Exception:  # noqa: BLE001 - the store host is gone; nothing left to tell
            pass
        finally:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def report_line(self) -> str:
        f = self._failure
        return f"error: {f}; stopped all {self.world_size} ranks" if f else ""

    def is_reporter(self) -> bool:
        """The one rank that prints the line: rank 0, or rank 1 when rank 0 is the one that failed."""
        return self._failure is not None and self.rank == (1 if self._failure.rank == 0 else 0)

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not self.active:
            self.stop()
            if self._failure is not None:  # rank 0 learned of a failure while it waited for the others
                self._report()
                raise SystemExit(self.exit_code)
            return False
        failure = exc if isinstance(exc, PeerFailed) else None
        if failure is None and self._failure is not None:
            failure = self._failure  # a peer failed first; our error is a consequence
        if failure is None and is_communication_error(exc):
            # A collective noticed a dead peer before the heartbeats did: the rank that watches it
            # names it within dead_after_s of its last heartbeat. Give them that time.
            failure = self._wait_for_failure(self.dead_after_s + 3 * self.heartbeat_s)
        if failure is None:
            if isinstance(exc, SystemExit) and exc.code in (0, None):
                self.stop()
                return False
            reason = describe(exc)
            failure = self._post(self.rank, f"failed: {reason}", announce=False)
            if is_communication_error(exc) and failure.rank != self.rank:
                pass  # the dead peer's failure was posted meanwhile: ours is its consequence
            else:
                # This rank's own error, which it prints itself (run_main's `error:` line, or a
                # traceback), also when another rank's own error came first (an argument check
                # every rank makes). Its exit ends the others under srun -K: their line first.
                if self.is_reporter():
                    self._mark_reported()  # nothing to add: each failed rank prints its own
                else:
                    self._report()
                self.stop()
                return False
        self._record(failure)
        self._report()  # before stop(): rank 0 lingers there, and srun may end it meanwhile
        self.stop()
        raise SystemExit(self.exit_code) from None

    # ------------------------------------------------------------------ internals
    def _key(self, what: str) -> str:
        return f"{self.name}/{what}"

    def _post(self, rank: int, reason: str, announce: bool = True) -> PeerFailed:
        failure = PeerFailed(rank, reason)
        if self.active and self._store is not None:
            try:
                stored = self._store.compare_set(self._key("failed"), "", f"{rank}\n{reason}")
                failure = self._parse(stored)
            except Exception:  # noqa: BLE001 - store gone: keep our own view
                pass
        self._record(failure, announce)
        return self._failure

    @staticmethod
    def _parse(value: bytes) -> PeerFailed:
        rank, _, reason = value.decode(errors="replace").partition("\n")
        return PeerFailed(int(rank), reason)

    def _record(self, failure: PeerFailed, announce: bool = True) -> None:
        if self._failure is None:
            self._failure = failure
        if announce and self.active and self.is_reporter():
            self._print_line()  # now, before this rank waits for anything: another rank's exit may end it

    def _print_line(self) -> None:
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
            print(self.report_line(), file=self._out or sys.stderr, flush=True)
        self._mark_reported()

    def _mark_reported(self) -> None:
        try:
            self._store.set(self._key("reported"), "1")  # the others may leave now
        except Exception:  # noqa: BLE001 - store gone: nobody waits for it
            pass

    def _lost_store(self, err: BaseException) -> PeerFailed:
        return PeerFailed(0, f"is gone: the store stopped answering ({describe(err)}); it lives in rank 0's "
                             f"process (under torchrun: the first node's torchrun), so that process or node died")

    def _wait_for_failure(self, seconds: float) -> PeerFailed | None:
        """The failure another rank posts within `seconds`, read from the store itself (the
        watchdog thread may be slow to read it on a busy machine), or None."""
        deadline = time.monotonic() + seconds
        while self._failure is None and time.monotonic() < deadline:
            try:
                if self._store.check([self._key("failed")]):
                    self._record(self._parse(self._store.get(self._key("failed"))))
            except Exception as err:  # noqa: BLE001 - the store went away: its host died
                self._record(self._lost_store(err))
            time.sleep(min(0.05, self.heartbeat_s))
        return self._failure

    def _report(self) -> None:
        """The reporter prints the line (once); any other rank waits until it is out.

        A rank that leaves first, with a non-zero code, ends the reporter under srun
        --kill-on-bad-exit (and torchrun): so wait for the reporter's "reported" key as long as
        the reporter is alive (its heartbeat moved within dead_after_s; it prints as soon as its
        thread reads the failure, within heartbeat_s), not for a fixed time that a slow or busy
        reporter can outlast.
        """
        if self._failure is None or not self.active:
            return
        reporter = 1 if self._failure.rank == 0 else 0
        if self.rank == reporter:
            self._print_line()
            return
        beat, since = None, time.monotonic()
        while True:
            try:
                if self._store.check([self._key("reported")]):
                    return
                if reporter != 0 and self._store.check([self._key(f"done/{reporter}")]):
                    return  # rank 1 finished and left before rank 0 failed: nobody is left to say it
                now = time.monotonic()
                current = self._store.add(self._key(f"beat/{reporter}"), 0)
            except Exception:  # noqa: BLE001 - the store's host is gone (rank 0's process under srun):
                # the reporter, rank 1, learns it at its own next heartbeat, when its store call
                # fails, and prints then; give it that heartbeat before this rank's exit can end it
                time.sleep(2 * self.heartbeat_s)
                return
            if current != beat:
                beat, since = current, now
            elif now - since > self.dead_after_s:
                return  # the reporter is gone too: nobody is left to say it
            time.sleep(min(0.05, self.heartbeat_s))

    def _node_of(self, rank: int) -> str:
        """' n2' (the node rank `rank` said it runs on), or '' when it did not say."""
        try:
            if self._store.check([self._key(f"node/{rank}")]):
                return " " + self._store.get(self._key(f"node/{rank}")).decode(errors="replace")
        except Exception:  # noqa: BLE001 - store gone
            pass
        return ""

    def _linger(self) -> None:
        """Rank 0 at the end: wait until every rank is done; watch the ones still running (the ring may be gone)."""
        last: dict[int, tuple[int, float]] = {}
        deadline = None
        while self._store.add(self._key("done"), 0) < self.world_size:
            now = time.monotonic()
            if self._failure is not None:
                deadline = deadline or now + self.grace_s + 3 * self.heartbeat_s
                if now > deadline:
                    return
            else:
                for r in range(1, self.world_size):
                    if self._store.check([self._key(f"done/{r}")]):
                        continue
                    beat = self._store.add(self._key(f"beat/{r}"), 0)
                    if r not in last or last[r][0] != beat:
                        last[r] = (beat, now)
                    elif now - last[r][1] > self.dead_after_s:
                        self._post(r, f"stopped responding (no heartbeat for {now - last[r][1]:.0f} s): "
                                      f"it died or was killed, or its node{self._node_of(r)} did")
                        break
            time.sleep(min(0.05, self.heartbeat_s))

    def _watch(self) -> None:
        """Background thread: heartbeat, failure polling, death and stall detection, hard exit."""
        store, peer = self._store, (self.rank + 1) % self.world_size
        peer_beat, peer_since = -1, time.monotonic()
        while self._failure is None and not self._stop.is_set():
            now = time.monotonic()
            try:
                store.add(self._key(f"beat/{self.rank}"), 1)
                if store.check([self._key("failed")]):
                    self._record(self._parse(store.get(self._key("failed"))))
                    break
                beat = store.add(self._key(f"beat/{peer}"), 0)
                if beat != peer_beat:
                    peer_beat, peer_since = beat, now
                elif now - peer_since > self.dead_after_s and not store.check([self._key(f"done/{peer}")]):
                    self._post(peer, f"stopped responding (no heartbeat for {now - peer_since:.0f} s): "
                                     f"it died or was killed, or its node{self._node_of(peer)} did")
                    break
                if (self.stall_after_s is not None and self._progress_time is not None and not self._waiting
                        and now - self._progress_time > self.stall_after_s):
                    self._post(self.rank, f"made no progress for {now - self._progress_time:.0f} s: it hangs "
                                          f"(I/O, or a collective waiting for a rank that hangs)")
                    break
            except Exception as err:  # noqa: BLE001 - DistNetworkError and friends: the store host died
                if self._stop.is_set():
                    return
                self._record(self._lost_store(err))
                break
            self._stop.wait(self.heartbeat_s)
        if self._stop.is_set() or self._failure is None:
            return
        # A failure is known. Give the main thread grace_s to see it (step/check/wait_for_all) and
        # leave cleanly; a main thread blocked in a collective cannot, so end the process here.
        if self._stop.wait(self.grace_s):
            return
        self._report()
        self._hard_exit(self.exit_code)


def node_name() -> str:
    """This rank's node: Slurm's name for it (SLURMD_NODENAME) under Slurm, else the host name."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def odd_ranks(rows: Sequence[Sequence[int]]) -> list[int]:
    """Ranks whose row differs from rank 0's."""
    return [rank for rank, row in enumerate(rows) if list(row) != list(rows[0])]


def check_same_on_every_rank(numbers: Sequence[int], what: str, hint: str = "", device=None) -> None:
    """All-gather a few integers (a fingerprint) and stop when a rank's differ from rank 0's.

    Each rank plans its work on its own; when two ranks see different inputs (node-local
    copies of a dataset, another config) their results must not be merged. The differing
    ranks raise UserError; the others raise PeerFailed naming the first of them. Every rank
    must pass the same number of integers.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    mine = torch.tensor([int(n) for n in numbers], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    odd = odd_ranks([g.tolist() for g in gathered])
    if not odd:
        return
    rank = dist.get_rank()
    message = f"sees a different {what} than rank 0{hint}"
    if rank in odd:
        raise UserError(f"rank {rank} {message}")
    raise PeerFailed(odd[0], message)


__all__ = ["Watchdog", "PeerFailed", "check_same_on_every_rank", "odd_ranks", "describe", "is_communication_error"]
