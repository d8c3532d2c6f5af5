# `make book`: create .venv from nothing, install, build the HTML book into _build/html from stored results.
# `make test`: pytest over tests/, every chapter and CPU headline under a second CPU setting (the two-settings
#              check, nbval against the stored outputs), then the book build with -W, then the
#              checks of the built text (tools/book_checks.py: words per main-path chapter, table shapes, generated
#              garbage), then the browser check: every page opened in headless Chromium (apt-get install chromium
#              chromium-driver), its checks only: `make browser-check` alone also writes screenshots of every page
#              at 1280 and 400 px into _build/screenshots/.
PYTHON ?= python3
# CPU numerics independent of the machine (the chapters' stored outputs are compared by nbval on whatever CPU runs
# the tests): ATen's portable kernels instead of its AVX2/AVX-512 ones, MKL's and oneDNN's CPU-independent code
# paths, and a fixed number of threads (reductions split by thread count). The library sets the same when it is
# imported (lpfail.numerics.PINS); exported here as well, for processes that import torch before lpfail.
export ATEN_CPU_CAPABILITY := default
export MKL_CBWR := COMPATIBLE
export ONEDNN_MAX_CPU_ISA := AVX2
export OMP_NUM_THREADS := 2
export MKL_NUM_THREADS := 2
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test pytest invariance nbval-pinned build-strict book-checks browser-check notebooks clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

book: $(STAMP)
	$(BIN)/jupyter-book build . --builder html
	@echo "the book is in _build/html/index.html"

# pytest exits non-zero (5) when it collects no test, which fails make: an empty run is never a pass. Two workers
# (pytest-xdist), each given whole files; each keeps the two threads set above, so every reduction splits as in a
# serial run; the 25 slowest tests are listed.
pytest: $(STAMP)
	$(BIN)/python -m pytest tests -p no:cacheprovider -n 2 --dist loadfile --durations=25

# The two-settings check (tools/cpu_invariance.py): every chapter re-executed and compared with its stored outputs
# (nbval) under one thread, ATen's vectorised kernels, oneDNN's and MKL's native paths and every random draw
# nudged by one ulp, and each CPU experiment's headline under both settings. The stored outputs were computed under
# the pins above (`make notebooks`), so an output that differs has changed with the code, or depends on the machine
# (or is chaotic): either fails the check. `make nbval-pinned` compares the chapters under the pins alone.
invariance: $(STAMP)
	$(BIN)/python tools/cpu_invariance.py all

nbval-pinned: $(STAMP)
	$(BIN)/python -m pytest book --nbval --nbval-current-env --nbval-sanitize-with book/nbval_sanitize.cfg \
		-p no:cacheprovider -n 2 --dist loadfile

build-strict: $(STAMP)
	$(BIN)/jupyter-book build . --builder html -W -n --keep-going

# The built pages' text (no browser): at most 3,000 words of prose and no table over 10 rows per main-path chapter,
# no table with rows of unequal cell count, no "x to x" range, "stored: stored" repeat or placeholder.
book-checks: $(STAMP)
	$(BIN)/python tools/book_checks.py _build/html --toc _toc.yml --json _build/book_checks.json

# Every page in headless Chromium: console errors, off-site resources, broken internal links and anchors,
# images that did not load, untypeset math, widgets without a static twin, output boxes wider than the text
# column at 1280 px, words broken inside table cells at 1280 px, pages that scroll sideways and figure text under
# 9 px at 400 px; whole-page screenshots at both widths (tools/browser_check.py) unless SHOTS is empty, as under
# `make test`, which runs the checks alone (the screenshots are three quarters of the check's time).
SHOTS ?= _build/screenshots
browser-check: $(STAMP)
	$(BIN)/python tools/browser_check.py _build/html --screenshots _build/screenshots $(if $(SHOTS),,--no-screenshots)

test: pytest invariance build-strict book-checks browser-check
test: SHOTS :=

# Re-execute every chapter in place (on a GPU machine, LPFAIL_RECOMPUTE=1 recomputes stored results).
notebooks: $(STAMP)
	$(BIN)/python tools/nbbuild.py execute book/*.ipynb

clean:
	rm -rf _build
