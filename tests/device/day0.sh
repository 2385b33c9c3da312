#!/usr/bin/env bash
# The day-0 check on a bare GPU machine, no Slurm: what a development session runs on a lent GPU
# (one command, at most 8 minutes of its 10; about 8 files come back), and what an instructor
# can run on an interactive node.
#
#   make device-wheels                     # here, with the network: .device-wheels/ (pure Python)
#   OUT=DIR bash tests/device/day0.sh      # there: the machine's own python3 and its torch
#
# The machine's python3 (PY=... for another) is used as it is, never a venv made on top of it: a
# venv's torch is not seen from a venv made from that venv's interpreter, which links the *base*
# interpreter (coursetools/day0.py says why, with the Python docs, and why no pip either). The
# course's packages it lacks (tests/device/wheels.txt) are unpacked from .device-wheels/ into
# SCRATCH/site, and PYTHONPATH = that and the repository, for every process.
#
# Steps, each bounded by its own time and all by one deadline (DAY0_SECONDS, 450 s: the summary
# and the machine's start-up fit in the 8 minutes): the environment check (wellfno.toolchain);
# the day-0 check's task (coursetools/gpucheck.py, as slurm/00_gpu_check.sbatch runs it);
# solution 11 with --compile on the GPU, early (does the compiled model, its spectral convolutions
# run eagerly (wellfno.model.EagerSpectralConv), train there?; its cache then serves step 06's
# compiled run); the node step (training steps, DDP on 2 GPUs, step 06's bf16 and compile runs,
# then `pytest -m gpu` with what time is left but the ladder's); its report. Without a GPU, `pytest --collect-only -m gpu` stands in for
# the GPU tests (the node step runs them only on a GPU): do they import here? Then, with the time
# left, the first GPU numbers: the course's ladder (fno.py, 02, 08, 09 bf16, 11 compiled:
# samples/s, MFU, J/sample and mean W) on a 128x128 dataset made in the background meanwhile, one
# results file.
#
# $OUT gets at most 8 files (coursetools/day0.py, OUT_FILES): day0.txt (the verdict, each step,
# each GPU question answered or NOT ANSWERED (why)), day0.json, gpu_check.txt/.json,
# toolchain.txt, compile.log, day0.log (each step's log's tail), ladder.json. Everything else
# goes to DAY0_SCRATCH (runs/day0_scratch), outside $OUT. A step out of time is NOT ANSWERED
# (timed out after N s), never a failure. Exit status: the number of failed steps and wrong
# answers (0: PASS, or INCOMPLETE with only questions not answered); 2: the machine cannot run it
# (no torch, bad settings, or the site step's packages: then every later step is SKIPPED, and
# day0.txt names each package missing or too old, and what to load).
#
# DAY0_DRY_RUN=1: tiny budgets and sizes, no --expect-gpu: the whole script on a CPU
# (tests/test_day0.py runs it on a stand-in of the lent machine).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-runs/device_day0}
SCRATCH=${DAY0_SCRATCH:-runs/day0_scratch}
WHEELS=${DAY0_WHEELS:-.device-wheels}
PY=${PY:-python3}
DRY=${DAY0_DRY_RUN:-}
TOTAL=${DAY0_SECONDS:-450}
START=$(date +%s)

die() {  # one line on stderr and in $OUT/day0.txt (what comes back from a lent machine)
  echo "error: $*" >&2
  mkdir -p "$OUT" 2>/dev/null && printf 'day-0 check: error: %s\n' "$*" > "$OUT/day0.txt"
  exit 2
}
case $TOTAL in ''|*[!0-9]*) die "DAY0_SECONDS=$TOTAL is not a whole number of seconds";; esac
DEADLINE=$((START + 10#$TOTAL))
[ -e "$OUT" ] && [ ! -d "$OUT" ] && die "OUT=$OUT is a file; give a folder"
out_abs=$(realpath -m "$OUT"); scratch_abs=$(realpath -m "$SCRATCH")
case "$scratch_abs/" in "$out_abs"/*) die "DAY0_SCRATCH=$SCRATCH is inside OUT=$OUT; give a folder outside it (only the summary goes to OUT)";; esac
case "$out_abs/" in "$scratch_abs"/*) die "OUT=$OUT is inside DAY0_SCRATCH=$SCRATCH; give a folder outside it";; esac
# The scratch folder is emptied for a fresh check: only one an earlier run made (its marker)
if [ -e "$SCRATCH" ] && [ ! -e "$SCRATCH/.day0-scratch" ] && [ -n "$(ls -A "$SCRATCH" 2>/dev/null)" ]; then
  die "DAY0_SCRATCH=$SCRATCH holds files day0.sh did not write; give a new or empty folder"
fi

# The machine's Python, and its torch: nothing else can run without them.
py_path=$(command -v "$PY") || die "no '$PY' on PATH: load the site's Python and PyTorch (module load, a container) or give PY=<a python that imports torch>"
err=$(mktemp)
gpus=$("$py_path" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>"$err")
why=$(grep -v '^\s' "$err" | tail -1); rm -f "$err"
[ -n "$gpus" ] || die "$PY ($py_path) cannot import torch (${why:-no output}): load the site's PyTorch (module load, a container) or give PY=<a python that imports torch>"

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH/logs" "$OUT" || die "cannot make $SCRATCH and $OUT"
touch "$SCRATCH/.day0-scratch"
# an earlier run's summary files (coursetools/day0.py OUT_FILES), so that none is taken for this one's
rm -f "$OUT"/{day0.txt,day0.json,gpu_check.txt,gpu_check.json,toolchain.txt,compile.log,day0.log,ladder.json}
export PYTHONPATH="$scratch_abs/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
STEPS=$SCRATCH/steps.tsv
failed=0

left() { echo $((DEADLINE - $(date +%s))); }
BLOCKED=  # why every later step is skipped (the site step failed: they would all fail the same way)
step() {  # step NAME CAP CMD...: CMD in at most CAP s, never past the deadline; SCRATCH/logs/NAME.log
  local name=$1 cap=$2 t0 rc took budget
  shift 2
  if [ -n "$BLOCKED" ]; then
    printf '%s\tblocked\t0\t0\t%s\n' "$name" "$BLOCKED" >> "$STEPS"
    echo "day0: $name: SKIPPED ($BLOCKED)"; return 0
  fi
  budget=$(left); [ "$cap" -lt "$budget" ] && budget=$cap
  if [ "$budget" -lt 3 ]; then
    printf '%s\tskipped\t0\t0\t%s\n' "$name" "${NOTE:-}" >> "$STEPS"
    echo "day0: $name: NOT ANSWERED (no time left)"; return 0
  fi
  t0=$(date +%s)
  timeout -k 10 "$budget" "$@" > "$SCRATCH/logs/$name.log" 2>&1
  rc=$?
  took=$(($(date +%s) - t0))
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$took" "$budget" "${NOTE:-}" >> "$STEPS"
  if [ "$rc" = 0 ]; then
    echo "day0: $name: ok ($took s)"
  elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ "$took" -ge $((budget - 1)) ]; then
    echo "day0: $name: NOT ANSWERED (timed out after $budget s)"
  else
    failed=$((failed + 1))
    echo "day0: $name: FAILED (exit $rc after $took s): $(grep -v '^\s' "$SCRATCH/logs/$name.log" | tail -1)"
  fi
}

if [ -n "$DRY" ]; then  # a CPU run of every step: the smallest sizes
  node_size=(--steps 2 --batch-size 4 --grid 16); expect=(); node_cap=60; compile_cap=60
  ladder_min=60; ladder_opts=(--steps 2 --num-workers 0 --no-compile --rows 2)
else
  node_size=(); expect=(--expect-gpu); node_cap=90; compile_cap=150
  ladder_min=120; ladder_opts=(--steps 60 --num-workers 4 --row-seconds 90)
fi
compile=(); [ "$gpus" -gt 0 ] && compile=(--compile)  # the question is the GPU's (Triton)
# (${a[@]+"${a[@]}"} below: an empty array under set -u, which bash before 4.4 calls unbound)

# the course's packages first, and every module the course's programs import (coursetools/
# imports.py), imported here: without them nothing after can run, so a failure here skips every
# later step, with that reason (one line a package: which, and what to load or `make device-wheels`)
step site 60 "$py_path" -m coursetools.day0 site --wheels "$WHEELS" --target "$SCRATCH/site" \
  --record "$SCRATCH/site.json"
if [ "$failed" != 0 ]; then
  # the FAILED line above gave the last error line; the others (one a package) here
  grep '^error: ' "$SCRATCH/logs/site.log" | head -n -1 | sed 's/^/day0: site: /'
  BLOCKED="the site step failed"
fi
# The ladder's data, made while the checks run (CPU work beside the GPU's): The Well's grid,
# 128x128 (gray_scott_reaction_diffusion's), so that the FNO's FFTs and convolutions are the real
# ones (the 32x32 demo set leaves an H200 idle), few trajectories and frames (12 x 19 training
# windows, 91 MB, seconds to make): a few hundred steps of each row, not an epoch's worth of data.
# A dry run reuses the tiny set.
large_pid=
if [ -z "$DRY" ] && [ -z "$BLOCKED" ]; then
  ( t0=$(date +%s)
    timeout -k 10 200 "$py_path" -m wellfno.grayscott --data-dir "$SCRATCH/data_large" \
      --size large --n-train 2 --n-steps 20 > "$SCRATCH/logs/data_large.log" 2>&1
    echo "$? $(($(date +%s) - t0))" > "$SCRATCH/data_large.rc" ) &
  large_pid=$!
fi
step toolchain 60 "$py_path" -m wellfno.toolchain
step task 90 "$py_path" -m coursetools.gpucheck task --out "$SCRATCH/gpu"
step data 60 "$py_path" -m wellfno.grayscott --data-dir "$SCRATCH/data_tiny" --size tiny
# solution 11 compiled, early: tiny data, 3 steps, batch 8 (step 06's compiled run's shapes: it
# finds this compile in Inductor's cache); without a GPU, eager (the script's plumbing only)
NOTE=${compile:+--compile}; NOTE=${NOTE:-eager: no GPU}
step compile "$compile_cap" "$py_path" solutions/11_compile/fno.py --data-dir "$SCRATCH/data_tiny" \
  --out "$SCRATCH/compile" --epochs 1 --max-steps 3 --batch-size 8 --bind none \
  ${compile[@]+"${compile[@]}"}
NOTE=
# the node step: its checks at most node_cap s, then pytest -m gpu what is left but the report's
# 30 s, the ladder's ladder_min s and the summary's
checks=$(left); checks=$((checks / 2 < node_cap ? checks / 2 : node_cap)); [ "$checks" -lt 1 ] && checks=1
tests=$(($(left) - checks - ladder_min - 60)); [ "$tests" -lt 1 ] && tests=1
NOTE="checks $checks s, pytest -m gpu $tests s"
step node $((checks + tests + 30)) "$py_path" -m coursetools.gpucheck node --out "$SCRATCH/gpu" \
  --pytest --budget "$checks" --pytest-budget "$tests" ${node_size[@]+"${node_size[@]}"}
NOTE=
step report 30 "$py_path" -m coursetools.gpucheck report "$SCRATCH/gpu" ${expect[@]+"${expect[@]}"}
if [ "$gpus" = 0 ]; then
  step collect 90 "$py_path" -m pytest --collect-only -q -m gpu -p no:cacheprovider tests
fi
# Part 5 of issue #40, the first GPU numbers: the course's ladder (fno.py, 02, 08, 09 bf16, 11
# compiled; coursetools/day0.py ladder) with what time is left, each row bounded, into one
# results file (SCRATCH/ladder/ladder.json, OUT/ladder.json; back in the repository,
# `python -m coursetools.day0 keep OUT/ladder.json` makes it the docs' GPU column).
ladder_data=$SCRATCH/data_tiny
if [ -n "$large_pid" ]; then
  wait "$large_pid"
  read -r rc took < "$SCRATCH/data_large.rc"
  printf 'data_large\t%s\t%s\t200\t128x128, in the background\n' "$rc" "$took" >> "$STEPS"
  if [ "$rc" = 0 ]; then ladder_data=$SCRATCH/data_large
  else failed=$((failed + 1)); echo "day0: data_large: FAILED (exit $rc): the ladder on the tiny set"
  fi
fi
budget=$(($(left) - 15))
step ladder "$budget" "$py_path" -m coursetools.day0 ladder --data-dir "$ladder_data" \
  --out "$SCRATCH/ladder/ladder.json" --seconds "$((budget > 20 ? budget - 10 : 10))" \
  ${ladder_opts[@]+"${ladder_opts[@]}"}
"$py_path" -m coursetools.day0 summary --scratch "$SCRATCH" --out "$OUT" --gpus "$gpus" \
  ${DRY:+--dry-run} > "$SCRATCH/logs/summary.log" 2>&1
wrong=$?
cat "$SCRATCH/logs/summary.log"
echo "day0: $(($(date +%s) - START)) s in all; results: $OUT ($(ls "$OUT" | wc -l) files), the rest: $SCRATCH"
# The summary's count: every failed step and wrong answer (a report that failed only for want of
# a node step that ran out of time is not one). A summary that did not finish: the steps' count.
if [ ! -s "$OUT/day0.txt" ] || [ "$(head -c 12 "$OUT/day0.txt")" != "day-0 check:" ]; then
  [ "$wrong" -lt "$failed" ] && wrong=$failed
  [ "$wrong" -lt 1 ] && wrong=1
fi
[ -n "$BLOCKED" ] && exit 2  # the machine cannot run it (the summary says why)
exit "$wrong"
