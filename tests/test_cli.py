"""wellfno.cli.run_main's way out of the process (cli.leave): what a clean exit needs is done,
Python's final teardown is not.

Each check runs a small program in a real process (os._exit cannot be watched from inside), and
compares it with the same program ended by sys.exit, the interpreter's ordinary exit.
"""
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
