# nbdist: `make demo` runs the quickstart notebook headless; `make test` runs the tests.
# Both create the virtual environment first if it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT := notebooks/_out

.PHONY: demo test test-fast bench lint browser clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test,tutorials,bench,browser]"
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(OUT)
	$(BIN)/jupyter nbconvert --to notebook --execute notebooks/00_quickstart.ipynb \
		--ExecutePreprocessor.timeout=600 --output-dir $(OUT) --output 00_quickstart.ipynb
	@echo "executed notebook: $(OUT)/00_quickstart.ipynb"

test: $(STAMP) browser
	$(BIN)/ruff check nbdist tests bench
	$(BIN)/python -m pytest -q

# What a developer runs while working: no notebook runs, no browser, no long stress tests
# (under 2 minutes on 2 cores). `make test` runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser"

bench: $(STAMP)
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/rpc.py
	$(BIN)/python bench/batching.py
	$(BIN)/python bench/metrics.py
	$(BIN)/python bench/multihost.py
	$(BIN)/python bench/spmd.py

lint: $(STAMP)
	$(BIN)/ruff check nbdist tests bench

# Headless Chromium for the dashboard's browser test. Where it is (or could be installed),
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
	rm -rf $(VENV) $(OUT) .pytest_cache
