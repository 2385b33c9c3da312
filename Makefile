# Two commands for a participant: `make demo` and `make test` (`make test-fast` for a quick loop).
# Everything else here is what those two need.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU/CUDA wheel from PyPI; a site can point this at its own build or index.
TORCH_SPEC ?= torch==2.13.0
# numpy for a torch older than 2.3 (2.1 trains, with known defects: INSTRUCTORS.md).
NUMPY_FOR_OLD_TORCH ?= numpy==1.26.4
DATA_DIR ?= $(if $(WELL_DATA),$(WELL_DATA),./data)
DEMO_OUT ?= runs/demo

.PHONY: demo test test-matrix test-fast venv data clean help results

help:
	@echo "make demo   set up .venv, generate the embedded dataset, train the baseline"
	@echo "make test   run the whole test suite"
	@echo "make test-matrix  every earlier step's checks on every later solution (long)"
	@echo "make test-fast  the suite without slow and Slurm tests (1-2 minutes on 2 cores)"
	@echo "make data   only generate the embedded dataset (DATA_DIR=$(DATA_DIR))"
	@echo "make results  re-measure every results/*.json the docs quote, then regenerate their tables (about 30 min)"

venv: $(VENV)/.installed

# Reuse an importable torch (e.g. `module load pytorch` on a cluster, a ROCm or
# CUDA build) through --system-site-packages; otherwise install $(TORCH_SPEC).
$(VENV)/.installed: requirements.txt pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "Found torch in $(PYTHON): creating $(VENV) with --system-site-packages to reuse it"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	@# requirements.txt pins numpy 2, which torch builds before 2.3 (compiled against NumPy 1.x)
	@# cannot import: with such a torch (a site's older module), install $(NUMPY_FOR_OLD_TORCH) instead.
	@if $(PY) -c "import sys, torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v >= (2, 3))"; then \
	  echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') predates 2.3: $(NUMPY_FOR_OLD_TORCH) instead of requirements.txt's numpy"; \
	  grep -v '^numpy==' requirements.txt > $(VENV)/requirements-old-torch.txt; \
	  $(PY) -m pip install -q -r $(VENV)/requirements-old-torch.txt "$(NUMPY_FOR_OLD_TORCH)"; \
	else \
	  $(PY) -m pip install -q -r requirements.txt; \
	fi
	$(PY) -m pip install -q --no-deps -e .
	@$(PY) -c "import torch; print('torch', torch.__version__, '| GPU:', torch.cuda.is_available())"
	@touch $@

data: venv
	$(PY) -m wellfno.grayscott --data-dir $(DATA_DIR) --size demo

demo: venv
	$(PY) fno.py --data-dir $(DATA_DIR) --out $(DEMO_OUT)

test: venv
	$(PY) -m pytest -q --durations=25 tests

# Every earlier step's checks on every later solution (make test: on its own and the last one).
test-matrix: venv
	WELLFNO_FULL_MATRIX=1 $(PY) -m pytest -q --durations=25 tests

# Everything but the `slow` (process groups, resume after a kill, notebooks) and `slurm` tests.
test-fast: venv
	$(PY) -m pytest -q -m "not slow and not slurm" tests

# Every number the READMEs and INSTRUCTORS.md quote, measured again on this machine (run it idle:
# each file records the load average), then the docs' tables regenerated from results/ (coursetools.results).
# One thread per process, so the numbers do not depend on how many cores torch guesses it has.
RESULTS_RUNS ?= runs/results
results: venv data
	export OMP_NUM_THREADS=1; set -e; \
	$(PY) -m coursetools.results runtimes; \
	$(PY) profiling/throughput.py --data-dir $(DATA_DIR) --out $(RESULTS_RUNS)/throughput --seconds 2 --repeats 2 \
	    --prefetch-factor 2 --results results/throughput.json; \
	$(PY) -m wellfno.grayscott --data-dir $(RESULTS_RUNS)/large_data --size large --n-train 2 --n-steps 50; \
	$(PY) profiling/throughput.py --data-dir $(RESULTS_RUNS)/large_data --out $(RESULTS_RUNS)/throughput_large \
	    --workers 0 --readers fast --seconds 2 --repeats 2 --results results/throughput_large.json; \
	$(PY) profiling/compare_scripts.py --data-dir $(DATA_DIR) --out $(RESULTS_RUNS)/scripts --repeats 2 \
	    --script-args "--epochs 1 --max-steps 30" --results results/compare_scripts.json --scripts fno.py \
	    solutions/01_profiling/fno.py "solutions/02_data_pipeline/fno.py --num-workers 2 --persistent-workers" \
	    "solutions/02_data_pipeline/fno.py --fast-reader" \
	    "solutions/02_data_pipeline/fno.py --num-workers 1 --persistent-workers --fast-reader" \
	    "solutions/03_affinity/fno.py --num-workers 1 --persistent-workers --fast-reader"; \
	$(PY) profiling/overhead.py --data-dir $(DATA_DIR) --batch-size 4 --wait 8 --after 8 --repeats 6 \
	    --results results/profiling_overhead.json; \
	$(PY) profiling/threads.py --data-dir $(DATA_DIR) --threads 1,2 --busy 0,1 --results results/threads.json; \
	$(PY) affinity/benchmark.py --out results/affinity_benchmark.json; \
	$(PY) solutions/04_distributed_stats/benchmark.py --synthetic-gb 1 --ranks 1,2 --repeat 3 \
	    --json results/04_stats_benchmark.json; \
	$(PY) solutions/09_compile_mfu/benchmark.py --data-dir $(DATA_DIR) --out results/efficiency_cpu --steps 20 \
	    --common "--bind none"
	$(PY) -m coursetools.results render

clean:
	rm -rf runs .pytest_cache
