#!/usr/bin/env bash
# The day-0 check on a bare GPU machine, no Slurm: what a development session runs on a lent GPU
# (one command, under 10 minutes), and what an instructor can run on an interactive node.
#
#   make device-wheels                     # here, with the network: .device-wheels/ (pure Python)
#   OUT=DIR bash tests/device/day0.sh      # there: the machine's own python3 and torch
#
# It makes .venv-device on top of the machine's Python (--system-site-packages: its CUDA or ROCm
# torch), adds the course's packages the machine lacks from .device-wheels/ (no network needed)
# and the repository itself, then runs: the environment check (wellfno.toolchain), the day-0
# check's task, node (training steps on the GPU, pytest -m gpu with its own budget) and report
# (coursetools/gpucheck.py, as slurm/00_gpu_check.sbatch does), and solution 11 with --compile on
# the GPU (does Inductor compile the FNO's complex spectral convolution there?). Everything lands
# in $OUT: toolchain.txt, gpu/ (gpu_check.txt, gpu_check.json), compile/. PY=python skips the
# venv (a machine that already has the course installed, or a dry run on a CPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/device_day0}
mkdir -p "$OUT"
if [ -z "${PY:-}" ]; then
  [ -x .venv-device/bin/python ] || python3 -m venv --system-site-packages .venv-device
  PY=.venv-device/bin/python
  if [ -d .device-wheels ]; then
    "$PY" -m pip install -q --no-index --no-deps .device-wheels/*.whl
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
fi
status=0
"$PY" -m wellfno.toolchain | tee "$OUT/toolchain.txt" || status=1
# budgets: training steps 120 s, pytest -m gpu 300 s, so the whole script stays under 10 minutes
"$PY" -m coursetools.gpucheck task --out "$OUT/gpu" || status=1
"$PY" -m coursetools.gpucheck node --out "$OUT/gpu" --pytest --budget 120 --pytest-budget 300 \
  || status=1
"$PY" -m coursetools.gpucheck report "$OUT/gpu" || status=1
# solution 11 compiled on the GPU: tiny data, 3 steps (Inductor on complex ops, issue #34)
"$PY" -m wellfno.grayscott --data-dir "$OUT/data_tiny" --size tiny >/dev/null || status=1
timeout 150 "$PY" solutions/11_compile/fno.py --data-dir "$OUT/data_tiny" --out "$OUT/compile" \
  --epochs 1 --max-steps 3 --batch-size 8 --bind none --compile > "$OUT/compile.log" 2>&1
compiled=$?
tail -2 "$OUT/compile.log"
where=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "the CPU")')
echo "solution 11 --compile on $where: exit code $compiled" | tee -a "$OUT/compile.log"
exit $status
