# llmkernels: `make demo`, `make test`, `make bench`. Each does its own set-up, idempotently:
# Debian packages (xsimd, xtl, OpenBLAS) if missing, a virtual environment in .venv/, and an
# editable install of the package (rebuilt when C++ sources or build files change).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
SYS_PACKAGES := libxsimd-dev xtl-dev libopenblas-dev libsimde-dev g++
BUILD_DEPS := "scikit-build-core>=0.10" "pybind11>=3.0" ninja "cmake>=3.18"
SOURCES := $(shell find cpp -type f) CMakeLists.txt pyproject.toml
# Every pip call below -- build isolation and .ci/test_wheel included -- installs the exact versions
# of constraints.txt (the lock, written by .ci/lock.py), so a fresh clone gets what was tested.
# `make upgrade-deps` re-resolves it to the newest releases, reinstalls and runs the suite.
LOCK := constraints.txt
export PIP_CONSTRAINT := $(abspath $(LOCK))

# `make test-sanitize`: a second editable install in its own venv and build dir (.venv-asan/,
# build/asan), compiled with AddressSanitizer + UndefinedBehaviorSanitizer (CMake option
# LLMK_SANITIZE), the suite run under it; the first report aborts the run. CPython is not
# instrumented, so the ASan runtime is preloaded, and ASan's leak check is off (it would report
# CPython's own allocations; `make test` has the leak tests). pytest captures only sys.stdout /
# sys.stderr, so a sanitizer report reaches the terminal even when it kills the process.
SAN_VENV := .venv-asan
SAN_PY := $(SAN_VENV)/bin/python
SAN_PIP := $(SAN_PY) -m pip --disable-pip-version-check
SAN_CXX := g++
SAN_ENV := LD_PRELOAD="$$($(SAN_CXX) -print-file-name=libasan.so) $$($(SAN_CXX) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:verify_asan_link_order=0:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1
# Not run under the sanitizers: the tests that measure memory (resident set over 100,000 calls,
# peak RSS of a 16k-token attention), which ASan changes by design -- freed blocks stay in its
# quarantine, every allocation gets redzones and shadow memory. `make test` runs them. (The
# tests of tests/robustness/test_reliability_threads.py that need RLIMIT_AS or measure the resident set skip
# themselves when libasan is preloaded.)
# Nor the notebooks and the benchmark scripts' smoke runs (Python driving the same kernels the
# suite tests directly; they take minutes under ASan).
SAN_SKIP := --ignore=tests/test_notebooks.py --ignore=tests/bench \
	--deselect tests/robustness/test_reliability.py::test_no_leak_ops \
	--deselect tests/robustness/test_reliability.py::test_no_leak_transformer_block \
	--deselect tests/robustness/test_reliability.py::test_no_leak_modules_and_model \
	--deselect tests/ops/test_attention.py::test_memory_is_streaming

.PHONY: demo docs test test-matrix test-sanitize test-wheel test-host-independent wheel bench lint \
	stubs clean sysdeps upgrade-deps

# a lean venv: the package and its [text] extra (torch, if `make test` installed it, joins the
# timing table)
demo: $(VENV)/.installed-text
	$(PY) examples/demo.py demo

# the documentation site (mkdocs.yml, docs/, the docstrings) into site/; warnings are errors
docs: $(VENV)/.venv-ready
	$(PIP) install -q mkdocs mkdocs-material "mkdocstrings[python]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PAR)

# Host independence, shown on one host: the suite with the references' transcendental functions
# perturbed by up to 4 ulp (tests/perturb_libm.py) -- what a host whose NumPy or libm rounds
# differently gives. (test-matrix runs its sse2 leg this way.)
PERTURB := LLMK_TEST_PERTURB_ULP=4
test-host-independent: $(VENV)/.installed-test
	$(PERTURB) $(PY) -m pytest -q $(PAR) $(MATRIX_SKIP)

# the lock re-resolved to the newest releases (the Makefile's requirements), everything
# reinstalled from it, and the suite run: commit constraints.txt when it passes
upgrade-deps: $(VENV)/.venv-ready
	env -u PIP_CONSTRAINT $(PY) .ci/lock.py $(PY) $(LOCK)
	rm -f $(VENV)/.installed-test $(VENV)/.installed-compare
	$(MAKE) test

# The whole suite again on each lower SIMD path (the default run, `make test`, is the best path
# with all threads; the kernel tests there already sweep every path in-process), one of them with
# one thread and with the references perturbed (test-host-independent). Two pytest workers (pytest-xdist) share the 2 cores (the suite holds no wall-clock
# assertion: it passes on a busy machine); the notebooks and the benchmark smoke tests run
# once, in `make test` (they call the same kernels).
PAR := -n 2 -p no:cacheprovider
MATRIX_SKIP := --ignore=tests/test_notebooks.py --deselect tests/models/test_plot.py \
	--ignore=tests/text/test_ray.py \
	--ignore=tests/bench
# (On an AVX2-only CPU avx2 is the best path, which `make test` has just run: not run twice.)
test-matrix: $(VENV)/.installed-test
	$(PERTURB) LLMKERNELS_ARCH=sse2 LLMKERNELS_NUM_THREADS=1 $(PY) -m pytest -q $(PAR) $(MATRIX_SKIP)
	@if [ "$$(env -u LLMKERNELS_ARCH $(PY) -c 'import llmkernels as lk; print(lk.simd_arch())')" \
	    = avx2 ]; then echo "avx2 is this CPU's best path: make test ran the suite on it"; \
	else set -x; LLMKERNELS_ARCH=avx2 $(PY) -m pytest -q $(PAR) $(MATRIX_SKIP); fi

# the whole suite on an ASan + UBSan build of the extension (any report fails the run)
test-sanitize: $(SAN_VENV)/.installed-test
	$(SAN_ENV) $(SAN_PY) -m pytest -q $(PAR) --capture=sys $(SAN_SKIP)

# `make wheel`: an sdist, a wheel built from it (so the sdist is shown to build), and that wheel
# repaired by auditwheel (with patchelf) into a manylinux wheel in wheelhouse/ that carries the
# shared libraries it needs (OpenBLAS and its Fortran runtime): `pip install` alone suffices.
WHEEL_VENV := build/wheel-venv
wheel: sysdeps
	rm -rf dist wheelhouse
	test -x $(WHEEL_VENV)/bin/python || $(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q --disable-pip-version-check build auditwheel patchelf
	$(WHEEL_VENV)/bin/python -m build --sdist --outdir dist .
	$(WHEEL_VENV)/bin/pip wheel -q --disable-pip-version-check --no-deps -w dist dist/llmkernels-*.tar.gz
	PATH="$(abspath $(WHEEL_VENV))/bin:$$PATH" $(WHEEL_VENV)/bin/auditwheel repair -w wheelhouse dist/llmkernels-*-linux_x86_64.whl
	$(WHEEL_VENV)/bin/auditwheel show wheelhouse/*.whl

# the wheels installed into fresh venvs, smoke-tested from outside the repository
test-wheel: wheel
	bash .ci/test_wheel

# `make bench`: the benchmark scripts (each writes <name>.md and <name>.json), the plots, and
# the performance page's benchmark tables (docs/performance.md) regenerated from the JSON (benchmarks/README.md)
bench: $(VENV)/.installed-compare
	$(PY) benchmarks/bench_ops.py --out benchmarks/results
	$(PY) benchmarks/bench_attention.py --out benchmarks/results
	$(PY) benchmarks/bench_blocks.py --out benchmarks/results
	$(PY) benchmarks/bench_sizes.py --out benchmarks/results
	$(PY) benchmarks/plot_results.py benchmarks/results/ops.json benchmarks/results/attention.json
	$(PY) benchmarks/render_tables.py

lint: $(VENV)/.installed-test
	$(PIP) install -q ruff
	$(VENV)/bin/ruff check python tests benchmarks

# regenerate python/llmkernels/_core.pyi from the built extension (commit the result)
stubs: $(VENV)/.installed-test
	$(PIP) install -q pybind11-stubgen
	$(VENV)/bin/pybind11-stubgen llmkernels._core -o build/stubs
	cp build/stubs/llmkernels/_core.pyi python/llmkernels/_core.pyi

# --- set-up ------------------------------------------------------------------------------------

sysdeps:
	@missing=""; for p in $(SYS_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "Installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "llmkernels needs these Debian packages:$$missing"; \
	    echo "Install them with:  sudo apt-get update && sudo apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi

$(VENV)/.venv-ready:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(BUILD_DEPS)
	touch $@

# editable install with the extras a target needs; rebuilt when the C++ or build files change
$(VENV)/.installed-test: $(VENV)/.venv-ready $(SOURCES) $(LOCK) | sysdeps
	$(PIP) install -q --no-build-isolation -e ".[test]"
	touch $@ $(VENV)/.installed-text

# (.[test] includes .[text]: `make test` leaves this one up to date too)
$(VENV)/.installed-text: $(VENV)/.venv-ready $(SOURCES) $(LOCK) | sysdeps
	$(PIP) install -q --no-build-isolation -e ".[text]"
	touch $@

$(VENV)/.installed-compare: $(VENV)/.venv-ready $(SOURCES) $(LOCK) | sysdeps
	$(PIP) install -q --no-build-isolation -e ".[compare,bench]"
	touch $@

$(SAN_VENV)/.venv-ready:
	$(PYTHON) -m venv $(SAN_VENV)
	$(SAN_PIP) install -q --upgrade pip
	$(SAN_PIP) install -q $(BUILD_DEPS)
	touch $@

$(SAN_VENV)/.installed-test: $(SAN_VENV)/.venv-ready $(SOURCES) $(LOCK) Makefile | sysdeps
	$(SAN_PIP) install -q --no-build-isolation -C cmake.define.LLMK_SANITIZE=ON \
	  -C cmake.define.CMAKE_CXX_COMPILER=$(SAN_CXX) -C cmake.build-type=RelWithDebInfo \
	  -C install.strip=false -C build-dir=build/asan -e ".[test]"
	touch $@

clean:
	rm -rf build dist wheelhouse site $(VENV) $(SAN_VENV) .pytest_cache
