# Two commands for a participant: `make demo` and `make test` (`make test-fast` for a quick loop).
# Everything else here is what those two need.
SHELL := /bin/bash
PYTHON ?= python3
# Inside the course's container image (containers/): its venv, made when the image was built
# (containers/install-course.sh); `make venv` there installs nothing.
ifdef WELLFNO_CONTAINER_VENV
VENV := $(WELLFNO_CONTAINER_VENV)
endif
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU/CUDA wheel from PyPI; a site can point this at its own build or index.
TORCH_SPEC ?= torch==2.13.0
# The oldest torch the course supports (wellfno/cli.py's OLDEST_TORCH), and the one CI's second
# leg tests it with (make venv-oldest, make test-oldest; INSTRUCTORS.md, "Oldest supported torch").
OLDEST_TORCH ?= 2.5
OLDEST_TORCH_SPEC ?= torch==2.5.1
OLDEST_VENV ?= .venv-oldest
DATA_DIR ?= $(if $(WELL_DATA),$(WELL_DATA),./data)
DEMO_OUT ?= runs/demo

.PHONY: demo test test-matrix test-fast test-oldest test-newest test-container venv venv-oldest device-wheels data clean help results

help:
	@echo "make demo   set up .venv, generate the embedded dataset, train the baseline"
	@echo "make test   run the whole test suite"
	@echo "make test-matrix  every earlier step's checks on every later solution (long)"
	@echo "make test-fast  the suite without slow and Slurm tests (1-2 minutes on 2 cores)"
	@echo "make test-oldest  the oldest supported torch's checks ($(OLDEST_TORCH_SPEC) in $(OLDEST_VENV); make venv-oldest)"
	@echo "make test-newest  the same checks on the newest torch wheel ($(NEWEST_TORCH_SPEC) in $(NEWEST_VENV))"
	@echo "make test-container  build the course's container image (podman) and run the course inside it"
	@echo "make data   only generate the embedded dataset (DATA_DIR=$(DATA_DIR))"
	@echo "make results  re-measure every results/*.json the docs quote, then regenerate their tables (ONLY=\"name ...\" for some)"

ifdef WELLFNO_CONTAINER_VENV
venv:
	@[ -f $(VENV)/.installed ] || { echo "error: WELLFNO_CONTAINER_VENV=$(VENV) is not the course image's venv (no $(VENV)/.installed): run make in the course's container (containers/), or unset WELLFNO_CONTAINER_VENV"; exit 2; }
else
venv: $(VENV)/.installed
endif

# Reuse an importable torch (e.g. `module load pytorch` on a cluster, a ROCm or
# CUDA build) through --system-site-packages; otherwise install $(TORCH_SPEC).
# A torch that lives in a venv (PYTHON is a venv's interpreter: sys.prefix != sys.base_prefix):
# --system-site-packages would give the new venv the *base* interpreter's site-packages, without
# that torch (https://docs.python.org/3/library/venv.html: a venv is made on top of its "base"
# Python); coursetools/sitevenv.py makes a plain venv that adds that venv's site-packages by a .pth.
$(VENV)/.installed: requirements.txt pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    if $(PYTHON) -c "import sys; sys.exit(sys.prefix == sys.base_prefix)"; then \
	      echo "Found torch in $(PYTHON), a venv's: creating $(VENV) on that venv's site-packages to reuse it"; \
	      $(PYTHON) -m coursetools.sitevenv $(VENV) || exit 2; \
	    else \
	      echo "Found torch in $(PYTHON): creating $(VENV) with --system-site-packages to reuse it"; \
	      $(PYTHON) -m venv --system-site-packages $(VENV); \
	    fi; \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	@# A site's torch older than the course supports: one line that says what to do, nothing more.
	@# (-W ignore: numpy comes with requirements.txt below, and torch imported without it warns
	@# "Failed to initialize NumPy", which says nothing about the version read here.)
	@$(PY) -W ignore -c "import sys, torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < tuple(map(int, '$(OLDEST_TORCH)'.split('.'))))" || \
	  { echo "error: torch $$($(PY) -W ignore -c 'import torch; print(torch.__version__)') is older than $(OLDEST_TORCH), the oldest this course supports: load a newer PyTorch module or container, or make venv VENV=.venv-new TORCH_SPEC=$(TORCH_SPEC) without one (INSTRUCTORS.md)"; exit 2; }
	$(PY) -m pip install -q -r requirements.txt
	@# neuraloperator requires wandb but imports it only where it is installed (neuralop/utils.py:
	@# "Only import wandb and use if installed"), and that import costs every process that imports
	@# neuralop 0.8 s of CPU (`import fno`: 4.5 s with it, 3.6 s without; README, "What we chose");
	@# the course logs nothing to wandb. `pip check` names it as missing; `pip install wandb` brings
	@# it back.
	$(PY) -m pip uninstall -q -y wandb
	$(PY) -m pip install -q --no-deps -e .
	@$(PY) -c "import torch; print('torch', torch.__version__, '| GPU:', torch.cuda.is_available())"
	@touch $@

data: venv
	$(PY) -m wellfno.grayscott --data-dir $(DATA_DIR) --size demo

demo: venv
	$(PY) fno.py --data-dir $(DATA_DIR) --out $(DEMO_OUT)

# Two workers (pytest-xdist): the Slurm tests, one xdist group (tests/conftest.py), first, on one
# of them in file order while the other runs the rest, a file at a time, in collection order.
# `-p no:xdist` (or no -n) runs in one process.
XDIST ?= -n 2 --dist loadgroup --no-loadscope-reorder

# Then the oldest supported torch's leg, where its venv exists (CI makes it: .ci/run).
# The container tests (pytest -m container) are a leg of their own: make test-container.
test: venv
	$(PY) -m pytest -q $(XDIST) --durations=25 -m "not container" tests
	@if [ -x $(OLDEST_VENV)/bin/python ]; then $(MAKE) --no-print-directory test-oldest; \
	else echo "(the oldest supported torch's leg skipped: make venv-oldest makes $(OLDEST_VENV))"; fi

# The oldest supported torch (a venv of its own, the PyPI wheel; it runs on a CPU; pip's cache
# keeps the wheel for the next time): make test-fast's tests, then DDP of every DDP step exact
# over an NCCL-like process group (tests/test_nccl_seam.py) and a short run of every solution
# (tests/test_oldest_torch.py).
# A plain venv first, so that a torch on the system's Python (a site's module) is not reused here.
venv-oldest:
	@[ -x $(OLDEST_VENV)/bin/python ] || $(PYTHON) -m venv $(OLDEST_VENV)
	$(MAKE) --no-print-directory venv VENV=$(OLDEST_VENV) TORCH_SPEC=$(OLDEST_TORCH_SPEC)

OLDEST_TESTS ?= tests/test_nccl_seam.py tests/test_oldest_torch.py tests/test_ddp_complex.py
test-oldest: venv-oldest
	$(OLDEST_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider -m "not slow and not slurm and not container" tests
	$(OLDEST_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider $(OLDEST_TESTS)

# The newest torch wheel (INSTRUCTORS.md's version table): the oldest leg's tests in a venv of its
# own. Not part of make test (another torch download, another few minutes); run it by hand when
# a new torch comes out.
NEWEST_TORCH_SPEC ?= torch==2.14.1
NEWEST_VENV ?= .venv-newest
test-newest:
	@[ -x $(NEWEST_VENV)/bin/python ] || $(PYTHON) -m venv $(NEWEST_VENV)
	$(MAKE) --no-print-directory venv VENV=$(NEWEST_VENV) TORCH_SPEC=$(NEWEST_TORCH_SPEC)
	$(NEWEST_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider -m "not slow and not slurm and not container" tests
	$(NEWEST_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider $(OLDEST_TESTS)

# Every earlier step's checks on every later solution (make test: each on its own solution).
test-matrix: venv
	WELLFNO_FULL_MATRIX=1 $(PY) -m pytest -q $(XDIST) --durations=25 -m "not container" tests

# Everything but the `slow` (process groups, resume after a kill, notebooks) and `slurm` tests.
FAST_TESTS ?= tests
test-fast: venv
	$(PY) -m pytest -q $(XDIST) -m "not slow and not slurm and not container" $(FAST_TESTS)

# The course's container image built from containers/ (podman, as root), and the course run inside
# it: make demo's training, make test-fast, the day-0 check's dry run, and each setup mistake's one
# line (tests/test_container.py). Skipped, saying so, where podman is absent; CI installs it
# (.ci/run). CONTAINER_FAST_TESTS: the tests make test-fast runs inside (all of them: CI).
CONTAINER_FAST_TESTS ?= tests
test-container: venv
	CONTAINER_FAST_TESTS="$(CONTAINER_FAST_TESTS)" $(PY) -m pytest -q -p no:xdist -m container -rs tests/test_container.py

# Every number the READMEs and INSTRUCTORS.md quote, measured again on this machine (run it idle: a
# line warns when the load is above the CPUs, and each file records the load at its start and end),
# each figure the best of a few rounds; then the docs' tables regenerated from results/.
# ONLY="05_ddp_scaling threads" measures only those (`python -m coursetools.measure --list` names them).
RESULTS_RUNS ?= runs/results
ONLY ?=
results: venv data
	$(PY) -m coursetools.measure --data-dir $(DATA_DIR) --runs $(RESULTS_RUNS) $(ONLY); status=$$?; \
	$(PY) -m coursetools.results render && exit $$status

# The course's pure-Python packages a bare GPU machine's image may lack (tests/device/wheels.txt:
# what the course imports beyond torch, numpy, h5py, matplotlib, pytest, scipy, PyYAML, tqdm), as
# wheels for tests/device/day0.sh there (no network needed; it unpacks only those the machine
# lacks). Pure-Python wheels only (py3-none-any: any platform, any CPython 3), checked against the
# machine's Python version's Requires-Python (DEVICE_PYTHON_VERSION).
DEVICE_PYTHON_VERSION ?= 3.12
device-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: --implementation py --abi none \
	  --platform any --python-version $(DEVICE_PYTHON_VERSION) -d .device-wheels \
	  -r tests/device/wheels.txt

clean:
	rm -rf runs .pytest_cache
