"""wellfno.cli.run_main's way out of the process (cli.leave): what a clean exit needs is done,
Python's final teardown is not.

Each check runs a small program in a real process (os._exit cannot be watched from inside), and
compares it with the same program ended by sys.exit, the interpreter's ordinary exit.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

PROGRAM = textwrap.dedent("""
    import atexit, gc, sys, threading, time
    from pathlib import Path
    from wellfno import cli

    gc.disable()  # no collection before the end: only the interpreter's teardown finalizes cycles

    folder, how = Path(sys.argv[1]), sys.argv[2]

    def late_writer():  # a non-daemon thread still at work when main returns
        time.sleep(0.3)
        (folder / "thread").write_text("done")

    class InACycle:  # garbage in a reference cycle: only Python's final collection finalizes it
        def __del__(self):
            (folder / "finalized").write_text("yes")

    def main():
        atexit.register(lambda: (folder / "atexit").write_text("ran"))
        threading.Thread(target=late_writer).start()
        cycle = InACycle()
        cycle.me = cycle
        print("said before leaving", end="")  # no newline: still in stdout's buffer (a pipe)
        if how == "error":
            raise cli.UserError("what to do")
        return 3

    if how == "sys.exit":
        cli.leave = sys.exit  # the interpreter's ordinary exit, for comparison
    cli.run_main(main)
""")


def _run(tmp_path, how):
    folder = tmp_path / how
    folder.mkdir()
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(folder), how], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    return result, {p.name: p.read_text() for p in folder.iterdir()}


@pytest.mark.parametrize("how", ["leave", "sys.exit"])
def test_leaving_keeps_what_a_clean_exit_does(tmp_path, how):
    """Status, buffered stdout, the atexit handlers and a thread still working: as sys.exit."""
    result, written = _run(tmp_path, how)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "said before leaving"
    assert written.get("atexit") == "ran", "the atexit handlers did not run"
    assert written.get("thread") == "done", "the non-daemon thread was not waited for"


def test_a_user_error_leaves_with_one_line_and_status_2(tmp_path):
    result, written = _run(tmp_path, "error")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: what to do"]
    assert written.get("atexit") == "ran" and written.get("thread") == "done"


def test_leaving_skips_the_final_collection(tmp_path):
    """The teardown that costs about 0.55 s of CPU after `import fno` (tests/exit_cost.py), and in
    which gloo's left-over threads can abort a rank (tests/gloo_exit_repro.py), is not run: an
    object in a reference cycle is finalized by sys.exit's teardown, not by leave's."""
    _, ordinary = _run(tmp_path, "sys.exit")
    _, left = _run(tmp_path, "leave")
    assert ordinary.get("finalized") == "yes", "the comparison is void: sys.exit did not finalize"
    assert "finalized" not in left, "leave ran Python's final teardown"


def test_an_interactive_session_goes_on_after_the_script(tmp_path):
    """`python -i` (or `%run` in Jupyter) keeps the interpreter after the script: leave must not
    end the process there, only raise SystemExit as sys.exit does."""
    program = ("from wellfno import cli\ntry:\n    cli.run_main(lambda: 3)\nexcept SystemExit as e:\n"
               "    print('still here, status', e.code)\n")
    result = subprocess.run([sys.executable, "-i", "-c", program], cwd=REPO, input="",
                            capture_output=True, text=True, timeout=60)
    assert "still here, status 3" in result.stdout, result.stdout + result.stderr


WRITES = textwrap.dedent("""
    import sys
    from wellfno import cli

    class Recorder:  # each write call, as its own line on the real stderr
        def write(self, text):
            sys.__stderr__.write(repr(text) + "\\n")
        def flush(self):
            sys.__stderr__.flush()

    sys.stderr = Recorder()
    def main():
        raise cli.UserError("what to do")
    cli.run_main(main)
""")


def test_a_user_error_is_one_write():
    """Under torchrun every rank may fail at once into one stderr. print() writes the text and
    the newline separately; with PYTHONUNBUFFERED=1 (python -u, common in job scripts) each is its
    own write(2), so two ranks' lines can run together ("error: ...error: ...\\n\\n")."""
    result = subprocess.run([sys.executable, "-c", WRITES], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [repr("error: what to do\n")]


UNBUFFERED_PRINTS = textwrap.dedent("""
    import io, sys
    from wellfno import cli

    class Recorder(io.RawIOBase):  # each write(2) of the stream, as its own line on the real stderr
        def writable(self):
            return True
        def write(self, data):
            sys.__stderr__.write(repr(bytes(data).decode()) + "\\n")
            return len(data)

    # what `python -u` (PYTHONUNBUFFERED=1) makes of stdout: write-through text over an unbuffered file
    sys.stdout = io.TextIOWrapper(Recorder(), write_through=True)
    def main():
        print("host=n1 rank=0 local_rank=0", flush=True)  # as solutions 03-14 print their report
        print("epoch 1/1  train_loss 1.1007")
    cli.run_main(main)
""")


def test_under_python_u_every_printed_line_is_one_write():
    """PYTHONUNBUFFERED=1 makes stdout write-through: print() writes the text and the newline
    apart, so torchrun's ranks (one terminal, one log) ran their `host=` lines together
    ("host=n1 ...host=n1 ...\\n\\n"). run_main makes each line one write, still a line at a time."""
    result = subprocess.run([sys.executable, "-c", UNBUFFERED_PRINTS], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [repr("host=n1 rank=0 local_rank=0\n"),
                                          repr("epoch 1/1  train_loss 1.1007\n")]


RANKS_FAIL = textwrap.dedent("""
    import os, time
    from wellfno import cli
    def main():
        time.sleep(1.0 - time.time() % 1.0)  # the ranks fail at the same moment
        raise cli.UserError(f"rank {os.environ['RANK']} cannot go on: " + "what to do " * 20)
    cli.run_main(main)
""")


def test_ranks_failing_together_under_torchrun_print_whole_lines(tmp_path):
    program = tmp_path / "fail.py"
    program.write_text(RANKS_FAIL)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD"))}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "3", str(program)], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env=dict(env, PYTHONUNBUFFERED="1"))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "error: " in line]
    assert sorted(lines) == [f"error: rank {r} cannot go on: " + "what to do " * 20
                             for r in range(3)], result.stderr
    assert "ChildFailedError" in result.stderr  # torchrun's own report follows (exercise 06's README)
