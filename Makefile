# nbdist: `make demo` runs the quickstart notebook headless; `make test` runs the tests.
# Both create the virtual environment first if it is missing.
# `make test TORCH=2.15.0` (or test-fast, test-range, bench, lint) does the same in .venv-torch-2.15.0, a
# venv with that torch and everything else as constraints.txt pins it: a user checks their own
# torch this way, and CI checks the newest and the oldest of the accepted range.
PY ?= python3
TORCH ?=
ifeq ($(strip $(TORCH)),)
VENV := .venv
CONSTRAINTS := constraints.txt
WANT_TORCH := $(shell sed -n 's/^torch==//p' constraints.txt)
else
WANT_TORCH := $(TORCH)
VENV := .venv-torch-$(TORCH)
CONSTRAINTS := $(VENV)/constraints.txt
# nbdist itself goes in without its dependencies, which follow without its torch range: a
# torch outside the range can be checked (that is how the range grows).
endif
# A constraint file set in pip's own configuration (global.constraint) may cap torch below the
# version pinned or asked for; the environment variable overrides that value, for this venv's
# pip only.
PIP_ENV := PIP_CONSTRAINT=$(CONSTRAINTS)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT := notebooks/_out

.PHONY: demo test test-fast test-range bench lint browser clean clean-torch conformance-torch \
	conformance-torch-sample docs

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(strip $(TORCH)),)
	$(PIP_ENV) $(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[test,tutorials,bench,browser,docs,ray]"
else
	sed 's/^torch==.*/torch==$(TORCH)/' constraints.txt > $(CONSTRAINTS)
	$(PIP_ENV) $(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -c "from importlib.metadata import requires; print('\n'.join( \
		r.split(';')[0] for r in requires('nbdist') if not r.startswith('torch')))" \
		> $(VENV)/requirements.txt
	$(PIP_ENV) $(BIN)/python -m pip install -q -c $(CONSTRAINTS) torch==$(TORCH) \
		-r $(VENV)/requirements.txt
endif
	$(BIN)/python -c "import sys, torch; v = torch.__version__.split('+')[0]; \
		sys.exit(None if v == '$(WANT_TORCH)' else 'installed torch ' + v + ', not $(WANT_TORCH)')"
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(OUT)
	$(BIN)/jupyter nbconvert --to notebook --execute notebooks/00_quickstart.ipynb \
		--ExecutePreprocessor.timeout=600 --output-dir $(OUT) --output 00_quickstart.ipynb
	@echo "executed notebook: $(OUT)/00_quickstart.ipynb"

# The documentation site, offline, from the tree: docs/_build/html/index.html, the tutorials
# run first where no run of their cells as they are exists (docs/execute_tutorials.py). `make test`
# builds it too (tests/docs_site/test_docs.py: warnings are errors, every link and anchor checked).
docs: $(STAMP)
	$(BIN)/python docs/execute_tutorials.py
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "the site: docs/_build/html/index.html"

test: $(STAMP) browser
	$(BIN)/ruff check nbdist tests bench docs
	NBDIST_CHROMIUM_MARKER=$(abspath $(VENV))/.chromium $(BIN)/python -m pytest -q

# What a developer runs while working: no notebook runs, no browser, no long stress tests, no
# conformance suite (minutes: script and world side by side; `make test` runs it)
# (about 13 minutes on 2 cores, 730 tests). `make test` runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser and not conformance"

# The tests where torch's version shows, for the other end of the accepted range (CI runs it
# on the oldest torch, `make test-range TORCH=2.8.0`): the patches' registry and pins (unit),
# worlds in this process (world), scripts and mp.spawn (scripts), the kernel tests of the
# patches (re-run cells, spawn, shared memory, interrupts), fast ones only, then the samples of
# torch's own RPC and c10d tests (about 8 minutes on 2 cores).
RANGE_TESTS := tests/unit tests/world tests/scripts tests/kernel/test_rpc_rerun.py \
	tests/kernel/test_spawn.py tests/kernel/test_shm.py tests/kernel/test_interrupts.py
test-range: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser and not conformance" $(RANGE_TESTS)
	$(BIN)/python -m pytest -q tests/torch_rpc tests/torch_c10d

# torch's own RPC tests from a notebook, the whole CPU pool (430), each form beside its
# reference (tests/torch_rpc): world form vs. plain processes (about 10 minutes on 2 cores),
# script form vs. torch's launcher (over 2 hours, nearly all of it the launcher's: a fresh
# process per rank per test). Writes bench/results/torch_rpc_world.* and torch_rpc_script.*.
# Then torch's c10d tests (tests/torch_c10d: 114, gloo, script form in one world, about 80 s,
# beside torch's launcher, 10 to 40 s a test): torch_c10d_script.*; the launcher runs only the
# tests its record lacks (--resume), so the record is completed over runs.
conformance-torch: $(STAMP)
	$(BIN)/python -m tests.torch_rpc.suite --forms world --out bench/results/torch_rpc_world
	$(BIN)/python -m tests.torch_rpc.suite --forms script --out bench/results/torch_rpc_script
	$(BIN)/python -m tests.torch_c10d.suite --resume --out bench/results/torch_c10d_script

# Their fast samples (also part of `make test`); CI runs them on the oldest torch of the range too.
conformance-torch-sample: $(STAMP)
	$(BIN)/python -m pytest -q tests/torch_rpc tests/torch_c10d

# Rewrites every file in bench/results, each naming the commit it measured (-dirty: with
# uncommitted changes). tests/benchmarks/test_bench_smoke.py runs each script with --smoke in `make test`.
bench: $(STAMP)
	$(BIN)/python bench/startup/startup.py
	$(BIN)/python bench/startup/_startup_whatif.py
	$(BIN)/python bench/startup/against.py
	$(BIN)/python bench/rpc/rpc.py
	$(BIN)/python bench/rpc/rpc.py --unpinned
	$(BIN)/python bench/rpc/batching.py
	$(BIN)/python bench/rpc/metrics.py
	$(BIN)/python bench/hosts/multihost.py
	$(BIN)/python bench/cells/spmd.py
	$(BIN)/python bench/gpu/gpu.py
	$(BIN)/python bench/cells/output.py
	$(BIN)/python bench/hosts/slurm.py
	$(BIN)/python bench/hosts/ray.py
	$(BIN)/python bench/shm/ps_shm.py
	$(BIN)/python bench/shm/shm_fixed_cost.py
	$(BIN)/python bench/shm/shm_medium.py
	$(BIN)/python bench/cells/widgets.py
	$(BIN)/python bench/cells/views.py
	$(BIN)/pip install -q --no-deps --upgrade --target .bench-peer jupyter-distributed==0.1.1
	NBDIST_BENCH_PEER_PATH=.bench-peer $(BIN)/python bench/startup/first_minute.py
	$(BIN)/python bench/lifecycle/fail_fast.py
	$(BIN)/python bench/lifecycle/lifecycle_stress.py
	$(BIN)/python bench/scale/scale.py
	$(BIN)/python bench/scale/starts.py

lint: $(STAMP)
	$(BIN)/ruff check nbdist tests bench docs

# Headless Chromium for the browser tests (the dashboard, the docs site). Where it is (or could be installed),
# its path goes to $(VENV)/.chromium and the browser test then fails rather than skip;
# where it cannot be installed the test is skipped with its reason in the pytest summary.
browser:
	@mkdir -p $(VENV); rm -f $(VENV)/.chromium
	@command -v chromium >/dev/null 2>&1 || \
		( (apt-get install -y -q chromium >/dev/null 2>&1 || \
		   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
		  || echo "chromium not installed: the browser test will be skipped" )
	@if command -v chromium >/dev/null 2>&1; then command -v chromium > $(VENV)/.chromium; fi

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache docs/_build

# Every venv of `make ... TORCH=X` (several GB each: a CUDA build of torch).
clean-torch:
	rm -rf .venv-torch-*
