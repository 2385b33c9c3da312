"""Every command in the exercise READMEs runs as written, on tiny data (issue 20, point 5).

The convention, for each exercises/NN_name/README.md listed in EXERCISES below:

- Every fenced block that opens with a bash fence (indented inside a list item or not) is a
  sequence a participant types. It runs here as written, with `bash -e -o pipefail`, in a
  fresh shell, in a scratch copy of the repository (tracked files; the venv linked in), from
  its root. The blocks of one README run in order in the same copy, so a later block may read
  what an earlier one wrote (task 5 of exercise 04 compares with task 1's file).
- A marker on the line just above the fence changes that:
  `<!-- ci: skip (reason) -->`: not run here (GPU or Slurm only, a long benchmark, the
  check-your-work commands, which the suite runs anyway); always give the reason.
  `<!-- ci: fails (reason) -->`: must exit non-zero (a "break it" recipe).
- The participant's own file is in place, finished, before the blocks run: PARTICIPANT maps
  each exercise to (path in the copy, the finished file). For 01-03 and 05-14 that is `fno.py`
  = the step's solution; for 04 `my_stats.py` = the starter with the test's answers
  (tests/test_stats_distributed.py: finished_starter).
- Data: WELL_DATA is the tiny generated dataset (the `tiny_data_dir` fixture, 16x16 cells,
  12 frames), which is what `fno.py` and every README command read by default; every process
  has OMP_NUM_THREADS=1. A README keeps its runs short by its own flags (`--max-steps`,
  `--seconds 1 --repeats 1`), which suit a participant's laptop too.
- `<!-- ci: printed by the bash block above -->` just above an output fence: that fence is what
  the nearest bash block above it prints, compared by `mismatch`: lines of the machine (host=...,
  torchrun's own log lines, torch.profiler's USDT notices, progress bars) are dropped from
  both, speeds masked (samples/s, times in s and ms, process ids, available RAM, measured peak
  MB, the GFLOP/s and MFU line; a line with a masked speed is compared with its spacing made one
  blank, since a right-aligned column pads a number by its width), the profile summary's step
  table masked cell by cell (profiling/summarize.py, `STEP_ROW`: each part's ms and share, not
  the step's number, its host syncs or collectives), the loader sweep's too (`TIMED_LINES`: in
  profiling/throughput.py's sweep the samples/s, ratios and the winning setting, not the reader,
  workers, pin and prefetch of a row, nor the sample count; its first line's CPU, cores, device
  and threads), and a line `[...]` in the README stands for any number of printed lines (such as
  torch.profiler's own table, whose rows are in the order of their times). A README whose
  output was made on the tiny set makes it in its block (`.venv/bin/python -m wellfno.grayscott
  --data-dir data_tiny --size tiny`) and passes `--data-dir data_tiny`; data_tiny is deleted
  before each README runs.
- A block that fails (or a `fails` block that succeeds) fails the test with one line: the
  README, the block's line, its exit status and its last line of output.

Adding an exercise: one line in PARTICIPANT (the file its participant edits, and what a
finished one is). The command test is `slow`: each block starts Python and imports torch, and
torchrun blocks start one process per rank more. What the READMEs skip, each with its reason on
the marker: GPU and Slurm commands, check-your-work (the suite runs it), torch.compile (20 s
to two minutes on a CPU; tests/test_11_compile.py compiles), and benchmarks of minutes.

Also here, quick: each README's task times add up to its `## Tasks (N minutes)` and to its
slot in INSTRUCTORS.md: the core track's row (slot and time of day) or the optional steps'
table (the README's *Optional* tasks are outside the slot), for the exercises in TIMED (every
one). And every command of every block, skipped or not, starts the venv's python and torchrun and
gives a training run its own `--out`.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, STEPS
from tests.test_taught_modules import TAUGHT



def finished_stats(folder: Path) -> Path:
    from tests.test_stats_distributed import finished_starter

    return finished_starter(folder)


# exercise folder -> (the participant's file in the repository, how to make a finished one)
PARTICIPANT = {
    "01_profiling": ("fno.py", lambda tmp: REPO / "solutions/01_profiling/fno.py"),
    "02_data_pipeline": ("fno.py", lambda tmp: REPO / "solutions/02_data_pipeline/fno.py"),
    "03_affinity": ("fno.py", lambda tmp: REPO / "solutions/03_affinity/fno.py"),
    "04_distributed_stats": ("my_stats.py", finished_stats),
    **{step: ("fno.py", lambda tmp, step=step: REPO / STEPS[step])
       for step in ("05_ddp", "06_exact_metrics", "07_failures", "08_host_syncs",
                    "09_mixed_precision", "10_mfu", "11_compile", "12_checkpointing",
                    "13_domain_parallel", "14_long_rollouts")},
}
# modules a finished file imports from beside it, which go beside it too (solution 03's binding,
# binding.py; solution 10's FLOP count, flop_count.py; solution 13's spectral convolution,
# domain_conv.py: tests/test_taught_modules.py)
BESIDE = {step: tuple(path for path, (_, taught_in, *_) in TAUGHT.items() if taught_in == step)
          for step in {taught_in for _, taught_in, *_ in TAUGHT.values()}}
EXERCISES = list(PARTICIPANT)
# the exercises whose README has `## Tasks (N minutes)` and a slot in INSTRUCTORS.md's agenda
TIMED = EXERCISES  # every exercise: its tasks add up to its slot in INSTRUCTORS.md
BLOCK_TIMEOUT = 300
FENCE = re.compile(r"^(?P<indent> *)```bash\s*$")
MARKER = re.compile(r"^\s*<!-- ci: (?P<kind>skip|fails) \((?P<reason>[^)]+)\) -->\s*$")


def bash_blocks(readme: Path) -> list[dict]:
    """The bash blocks of a README: line number, text (dedented), and the ci marker above it."""
    lines = readme.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, start, body = len(fence.group("indent")), i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        above = next((line for line in reversed(lines[:start - 1]) if line.strip()), "")
        marker = MARKER.match(above)
        blocks.append(dict(line=start, text="\n".join(body) + "\n",
                           kind=marker.group("kind") if marker else "run"))
        i += 1
    return blocks


PRINTED = "<!-- ci: printed by the bash block above -->"
OUTPUT_FENCE = re.compile(r"^(?P<indent> *)```\s*$")
# lines that depend on the machine, not on the command: dropped from both sides before comparing
MACHINE_LINE = re.compile(
    r"^host="                                    # the node's name, its cores and GPUs
    r"|^[WIE]\d{4} \d\d:\d\d:\d\d"               # torchrun's own log lines
    r"|^\*{10,}$|^Setting OMP_NUM_THREADS"        # torchrun's notice about OMP_NUM_THREADS
    r"|^\S[^|]*:\s+\d+%\|"                        # a progress bar (tqdm), at any point of it
    r"|^USDT:"                                    # the profiler's (kineto's) start and stop notices
)
# numbers that depend on the machine's speed or size: masked to `#` on both sides
SPEED = [
    (re.compile(r"\d[\d.,]*(?= samples/s)"), "#"),
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:s|ms)\b"), "# s"),
    (re.compile(r"(available RAM: )[\d.]+ GB"), r"\1# GB"),
    (re.compile(r"\(pid: \d+\)"), "(pid: #)"),  # a process id, in torchrun's report of a failed rank
    (re.compile(r"\d[\d.,]* ?(?:MB|MiB|GB|GiB)(?=.*\bpeak\b)|(?<=peak)[^\d\n]*\d[\d.,]*"
                r"(?= ?(?:MB|MiB|GB|GiB))"), "#"),
]
GFLOP_LINE = re.compile(r"^\S+ GFLOP/s achieved; MFU \S+ of .*$")
# a row of the profile summary's step table (profiling/summarize.py, format_steps): `#7`, then
# milliseconds (one decimal), the host syncs per step (and, when the run communicates,
# collectives, their ms and overlap %); or its `share` row, all percentages
STEP_ROW = re.compile(r"^ *(?:#\d+|share)(?: +(?:\d+(?:\.\d+)?%?|-))+$")
STEP_ROW_SPEED = re.compile(r"\d+(?:\.\d+)?%|\d+\.\d+")  # ms and shares; counts stay


def step_row(line: str) -> str:
    """A step-table row with its times and shares masked and its columns' padding (which follows
    the times' widths) collapsed: the step number and the syncs (and collectives) per step stay."""
    return " ".join(STEP_ROW_SPEED.sub("#", line).split())
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")  # not the 5 of h5py
# Lines of the loader sweep's tables, whose every number is a time, a speed or
# a ratio of two: those numbers become `#`, spacing one blank; what names the row is compared.
TIMED_LINES = [
    # profiling/throughput.py, a loader setting: `well  2  off  2  1234  456  345  0.76`: its
    # reader, workers, pin and prefetch
    (re.compile(r"^(\w+)\s+(\d+)\s+(on|off)\s+(\d+|-)(?:\s+\d+){3}\s+\d+\.\d+$"),
     lambda m: f"{m[1]} {m[2]} {m[3]} {m[4]} # # # #"),
    # profiling/throughput.py: the readers alone, and the best setting (which one wins is a speed)
    (re.compile(r"^(?:readers alone: |\w+: best full ).*$"), lambda m: NUMBER.sub("#", m[0])),
    # profiling/throughput.py's first line: the machine's CPU, cores, device and torch's threads
    (re.compile(r"^(\d+ configurations x \d+ rounds on ).*(, \d+ samples of .*)$"),
     lambda m: f"{m[1]}(this machine){m[2]}"),
]


def comparable(line: str) -> str | None:
    """A line of output as the comparison sees it: None for a machine's line, speeds masked."""
    line = line.rstrip()
    if not line.strip() or MACHINE_LINE.search(line):
        return None
    if GFLOP_LINE.match(line):  # the speed, and the machine's name and cores its peak is for
        return "# GFLOP/s achieved; MFU #% of (this machine)"
    if STEP_ROW.match(line):
        return step_row(line)
    for pattern, mask in TIMED_LINES:
        timed = pattern.match(line)
        if timed:
            return mask(timed)
    masked = line
    for pattern, mask in SPEED:
        masked = pattern.sub(mask, masked)
    # a right-aligned column pads a number by its width: once masked, the padding is the speed's too
    return masked if masked == line else " ".join(masked.split())


def mismatch(expected: str, got: str) -> str | None:
    """None when `got` prints what `expected` shows, else the first line that differs.

    Both sides go through `comparable`; a line `[...]` in `expected` stands for any number of
    lines of `got` (none included)."""
    want = [line.strip() if line.strip() == "[...]" else comparable(line)
            for line in expected.splitlines()]
    want = [line for line in want if line is not None]
    have = [c for c in map(comparable, got.splitlines()) if c is not None]

    def match(i: int, j: int) -> bool:
        while i < len(want) and want[i] != "[...]":
            if j >= len(have) or want[i] != have[j]:
                return False
            i, j = i + 1, j + 1
        if i == len(want):
            return j == len(have)
        return any(match(i + 1, k) for k in range(j, len(have) + 1))

    if match(0, 0):
        return None
    for i, line in enumerate(want):  # the first line that is not where the README has it
        if line == "[...]":
            return f"after a [...]: expected {want[i + 1] if i + 1 < len(want) else 'the end'!r}"
        if i >= len(have) or have[i] != line:
            return f"line {i + 1}: README {line!r}, printed {have[i] if i < len(have) else '(nothing)'!r}"
    return f"printed {len(have) - len(want)} more line(s): {have[len(want)]!r}"


def printed_blocks(readme: Path) -> list[dict]:
    """The output fences marked `PRINTED`: their text and the line of the bash block above."""
    lines = readme.read_text().splitlines()
    bash_lines = [b["line"] for b in bash_blocks(readme)]
    found = []
    for i, line in enumerate(lines):
        if line.strip() != PRINTED:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = OUTPUT_FENCE.match(lines[j]) if j < len(lines) else None
        assert fence, f"{readme}, line {i + 1}: the marker is not above an output fence"
        above = [start for start in bash_lines if start < i + 1]
        assert above, f"{readme}, line {i + 1}: no bash block above the marker"
        indent, body, j = len(fence.group("indent")), [], j + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][indent:])
            j += 1
        found.append(dict(line=i + 1, text="\n".join(body) + "\n", after=above[-1]))
    return found


def test_the_comparison_masks_speeds_and_skips():
    """Unit check of `mismatch`: what differs only in speed, machine or skipped lines matches,
    a changed loss or a missing line does not."""
    readme = ("host=vm rank=0 cpus=0-1 (2)\n"
              "a training step needs about 24 MB (batch 16); available RAM: 22.7 GB\n"
              "epoch 1: 100%|██████████| 3/3 [00:12<00:00,  4.25s/it]\n"
              "epoch 1/4  train_loss 1.0080  valid_loss 0.2437  3 samples/s (1 rank(s))\n"
              "[...]\n"
              "plain: 0.81 s per step, peak 62.0 MB\n"
              "0.15 GFLOP/s achieved; MFU 0.06% of 1 x Intel(R) Xeon(R) Processor, 2 cores (fp32)\n")
    printed = ("W1207 04:50:01.123000 123 torch/distributed/run.py:792] \n"
               "*****************************************\n"
               "host=n7 rank=0 cpus=0-15 (16)\n"
               "a training step needs about 24 MB (batch 16); available RAM: 120.3 GB\n"
               "epoch 1:   0%|          | 0/3 [00:00<?, ?it/s]\repoch 1: 100%|███| 3/3 [00:01]\n"
               "epoch 1/4  train_loss 1.0080  valid_loss 0.2437  155 samples/s (1 rank(s))\n"
               "epoch 2/4  train_loss 0.9\n"
               "epoch 3/4  train_loss 0.8\n"
               "plain: 12 ms per step, peak 71.5 MB\n"
               "6.27 GFLOP/s achieved; MFU 7.54% of 1 x AMD EPYC, 1 core (fp32)\n")
    assert mismatch(readme, printed) is None
    assert mismatch(readme.replace("[...]\n", ""), printed) is not None  # the skipped lines
    changed = printed.replace("valid_loss 0.2437", "valid_loss 0.2438")
    assert "valid_loss 0.2437" in mismatch(readme, changed)
    assert mismatch(readme, printed.replace("about 24 MB", "about 25 MB")) is not None
    assert mismatch(readme + "Wrote runs/x/metrics.json\n", printed) is not None
    assert mismatch("  exitcode  : 2 (pid: 31663)\n", "  exitcode  : 2 (pid: 7)\n") is None
    assert mismatch("  exitcode  : 2 (pid: 31663)\n", "  exitcode  : 1 (pid: 31663)\n") is not None


def test_the_comparison_masks_a_step_tables_times_not_its_syncs():
    """The profile summary's step table (profiling/summarize.format_steps): other milliseconds
    and shares, in columns as wide as they need, match; another count of host syncs does not."""
    from profiling.summarize import format_steps

    def table(ms: float, syncs: int) -> str:
        parts = dict(data_wait=ms / 10, h2d_copy=0.0, forward=ms / 3, backward=ms / 2,
                     optimizer=ms / 20)
        rest = ms - sum(parts.values())
        rows = [dict(step=step, total=ms, **parts, rest=rest, syncs=syncs, collectives=0,
                     comm_ms=0.0) for step in (7, 8)]
        return format_steps(rows) + "\n"

    readme = table(12.3, 0)
    assert mismatch(readme, table(1234.5, 0)) is None
    assert "printed '#7 # # # # # # # 1'" in mismatch(readme, table(12.3, 1))


def test_the_comparison_masks_the_times_of_the_profile_and_the_sweep():
    """Unit check of `STEP_ROW` and `TIMED_LINES`: profiling/summarize.py's and
    profiling/throughput.py's lines (as they print them) match whatever their times and speeds,
    not a changed step number, host sync count, operator, loader setting or sample count."""
    readme = ("Self CPU time total: 14.071s\n"
              "  step  total ms  data_wait   h2d_copy    forward   backward  optimizer       rest syncs/step\n"
              "    #7    3851.9      353.5        0.2     1661.9     1816.5       19.5        0.3          1\n"
              "    #9    5606.6      650.0        0.3     2280.8      191.6       18.1     2465.8          5\n"
              " share                10.4%       0.0%      39.3%      28.9%       3.8%      17.5%\n"
              "  #9 syncs in: aten::item x5\n"
              "    7103.28 ms     68 calls  aten::bmm\n"
              "2 configurations x 1 rounds on AMD EPYC 7763 64-Core Processor (2 cores), cpu, torch "
              "threads 1, 44 samples of data_tiny/datasets/gray_scott_embedded\n"
              "readers alone: raw h5py 1234, fast 567, WellDataset 89 samples/s; fast/raw 0.46, "
              "fast/WellDataset 6.4x\n"
              "well         2  off        2        196        40        39         0.98\n"
              "well: best full 39 samples/s with 2 workers (pipeline efficiency 0.98)\n")
    printed = ("Self CPU time total: 847.403ms\n"
               "  step  total ms  data_wait   h2d_copy    forward   backward  optimizer       rest syncs/step\n"
               "    #7      81.2       13.5        0.2       20.9       40.5        5.5        0.6          1\n"
               "    #9   12345.6    10650.0        0.3       80.8       91.6       18.1       65.8          5\n"
               " share                 9.9%       0.1%      19.3%      48.9%      13.8%       7.5%\n"
               "  #9 syncs in: aten::item x5\n"
               "     103.28 ms     68 calls  aten::bmm\n"
               "2 configurations x 1 rounds on Intel(R) Xeon(R) (16 cores), cuda, torch threads 16, "
               "44 samples of data_tiny/datasets/gray_scott_embedded\n"
               "readers alone: raw h5py 21234, fast 9567, WellDataset 1289 samples/s; fast/raw 0.45, "
               "fast/WellDataset 7.4x\n"
               "well         2  off        2       2196       140       129         0.92\n"
               "well: best full 129 samples/s with 0 workers (pipeline efficiency 0.92)\n")
    assert mismatch(readme, printed) is None
    for real, changed in [("#9 ", "#10 "), ("  5\n", "  4\n"), ("x5", "x4"), ("68 calls", "67 calls"),
                          ("aten::bmm", "aten::mm"), ("2  off        2", "3  off        2"),
                          ("off        2", "off        4"), ("44 samples", "45 samples"),
                          ("2 configurations", "3 configurations")]:
        assert changed in printed.replace(real, changed, 1), (real, changed)
        assert mismatch(readme, printed.replace(real, changed, 1)) is not None, (real, changed)


def test_the_convention_is_readable():
    """Unit check of the parser on a made-up README: indented fences, both markers, plain text."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        readme = Path(folder) / "README.md"
        readme.write_text("intro\n```bash\necho a\n```\n1. task\n   <!-- ci: skip (GPU only) -->\n"
                          "   ```bash\n   nvidia-smi\n   ```\n<!-- ci: fails (break it) -->\n\n"
                          "```bash\nfalse\n```\n```\nnot bash\n```\n")
        got = [(b["kind"], b["text"]) for b in bash_blocks(readme)]
    assert got == [("run", "echo a\n"), ("skip", "nvidia-smi\n"), ("fails", "false\n")]


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory) -> Path:
    """The repository as a clone has it (tracked, new, not ignored files), the venv linked."""
    root = tmp_path_factory.mktemp("repo")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


def run_block(text: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """One block in a fresh `bash -e -o pipefail`; stray background processes are ended after it."""
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", text], cwd=cwd, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n(timed out after {BLOCK_TIMEOUT} s)"
        return subprocess.CompletedProcess(proc.args, 124, out)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # a rank a recipe left in the background
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


BARE = re.compile(r"(?:^|[\s;&|(])(?P<tool>python3?|torchrun|pip3?)\s")
# a training run: python or torchrun (and its options) starting some fno.py
TRAINING = re.compile(r"\.venv/bin/(?:python|torchrun)(?:\s+-\S+(?:\s+\d+)?)*\s+(?:\S*/)?fno\.py\b")


@pytest.mark.parametrize("exercise", EXERCISES)
def test_commands_use_the_venv_and_their_own_output_folder(exercise):
    """`python` is not the venv's on a participant's laptop (no torch there), and a training run
    without --out writes runs/baseline, where the previous task's files still lie."""
    readme = REPO / "exercises" / exercise / "README.md"
    for block in bash_blocks(readme):
        command = re.sub(r"\\\n\s*", " ", block["text"])  # continuation lines joined
        command = re.sub(r'"[^"]*"', '""', command)  # python -c "..." programs are not commands
        for line in command.splitlines():
            line = line.split("#")[0]
            bare = BARE.search(line)
            assert not bare, (f"{readme.relative_to(REPO)}, the block at line {block['line']}: "
                              f"`{bare.group('tool')}` is not the venv's: write "
                              f".venv/bin/{bare.group('tool')}")
            if TRAINING.search(line):
                assert "--out" in line, (f"{readme.relative_to(REPO)}, the block at line "
                                         f"{block['line']}: a training run without --out")


TASKS = re.compile(r"^## Tasks \((?P<minutes>\d+) minutes\)$", re.M)
TASK_TIME = re.compile(r"^\d+\. \*\*[^\n]*?(?P<minutes>\d+) min\)", re.M)
AGENDA_ROW = re.compile(r"^\| (?P<start>\d\d):(?P<start_m>\d\d)–(?P<end>\d\d):(?P<end_m>\d\d) \| "
                        r"[^|]*?\((?P<slot>\d+) min[^|]*\| (?P<rest>.*)$", re.M)


@pytest.mark.parametrize("exercise", TIMED)
def test_task_times_add_up_to_the_slot(exercise):
    text = (REPO / "exercises" / exercise / "README.md").read_text()
    heading = TASKS.search(text)
    assert heading, f"exercises/{exercise}/README.md has no '## Tasks (N minutes)' heading"
    section = text[heading.end():]
    ends = [i for i in (section.find("\nOptional"), section.find("\n## ")) if i >= 0]
    section = section[:min(ends)]
    times = [int(m.group("minutes")) for m in TASK_TIME.finditer(section)]
    assert sum(times) == int(heading.group("minutes")), (
        f"exercises/{exercise}/README.md: the tasks take {' + '.join(map(str, times))} = "
        f"{sum(times)} min, the heading says {heading.group('minutes')}")
    agenda = (REPO / "INSTRUCTORS.md").read_text()
    optional = re.search(rf"^\| \[[^\]]*\]\(exercises/{exercise}/README\.md\)[^|]*\| (\d+) min \|",
                         agenda, re.M)
    if optional:  # an optional step: its slot in the optional steps' table, no time of day
        assert int(optional.group(1)) == sum(times), (
            f"exercise {exercise}: optional slot {optional.group(1)} min, "
            f"its tasks {sum(times)} min")
        return
    link = f"exercises/{exercise}/README.md"
    rows = [m for m in AGENDA_ROW.finditer(agenda) if link in m.group("rest")]
    assert len(rows) == 1, f"INSTRUCTORS.md's agenda has {len(rows)} rows for exercise {exercise}"
    row = rows[0]
    span = (int(row["end"]) * 60 + int(row["end_m"])) - (int(row["start"]) * 60
                                                           + int(row["start_m"]))
    assert int(row["slot"]) == span == sum(times), (
        f"exercise {exercise}: agenda slot {row['slot']} min, its time span {span} min, "
        f"its tasks {sum(times)} min")


@pytest.mark.slow
@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_readme_command_runs(exercise, scratch_repo, tiny_data_dir, tmp_path):
    readme = REPO / "exercises" / exercise / "README.md"
    blocks = bash_blocks(readme)
    assert [b for b in blocks if b["kind"] == "run"], f"{readme}: no bash block to run"
    own, finished = PARTICIPANT[exercise]
    (scratch_repo / own).unlink(missing_ok=True)
    shutil.copy2(finished(tmp_path), scratch_repo / own)
    for module in BESIDE.get(exercise, ()):
        shutil.copy2(REPO / module, scratch_repo / Path(module).name)
    shutil.rmtree(scratch_repo / "runs", ignore_errors=True)
    # a README whose output was made on the tiny set makes it itself (`wellfno.grayscott --data-dir
    # data_tiny --size tiny`): the previous exercise's copy must not stand in for that line
    shutil.rmtree(scratch_repo / "data_tiny", ignore_errors=True)
    printed = {}
    for block in printed_blocks(readme):
        printed.setdefault(block["after"], []).append(block)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                "MASTER_", "TORCHELASTIC", "STATS_"))}
    env.update(WELL_DATA=str(tiny_data_dir), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg")
    from tests.test_09_mixed_precision import as_cpu, this_cpu_has_bf16_units

    if not this_cpu_has_bf16_units():
        # The READMEs' `--amp bf16` commands are for a CPU or GPU with bf16 units (exercise 09
        # says a CPU without them refuses it in one line, tests/test_09_mixed_precision.py):
        # here they run as on a recorded CPU that has them (tests/cpu_seam).
        env.update(as_cpu("intel_xeon_amx"))
    for block in blocks:
        if block["kind"] == "skip":
            continue
        result = run_block(block["text"], scratch_repo, env)
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        last = lines[-1][:300] if lines else "(no output)"
        where = f"exercises/{exercise}/README.md, the block at line {block['line']}"
        if block["kind"] == "fails":
            assert result.returncode != 0, f"{where} is marked `ci: fails` but exited 0: {last}"
        else:
            assert result.returncode == 0, f"{where} exited {result.returncode}: {last}"
        for shown in printed.get(block["line"], []):
            differs = mismatch(shown["text"], result.stdout)
            assert differs is None, (f"exercises/{exercise}/README.md, the output at line "
                                     f"{shown['line']} is not what the block at line "
                                     f"{block['line']} prints: {differs}")
