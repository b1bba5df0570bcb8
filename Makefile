# The two entry points README.md starts with:  `make demo`  and  `make test`.
# Both create .venv on first use; everything is installed from the package index (torch from the pinned build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
DALI_PIN := nvidia-dali-cuda130==2.4.0
SAMPLE_IMAGES ?= 2000
DATA := data
# The native core as make sees it: a real file, rebuilt only when csrc/ or setup.py changed (the venv's Python is
# the one $(PY) made, so the suffix is the same).
NATIVE := fastfeed/_native$(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

.PHONY: setup build demo test test-fast test-sanitize clean

setup: $(VENV)/.installed build

# Order matters for speed and for pillow-simd:
# - the native core and pillow-simd compile in the background while torch downloads (the package is then installed
#   with FASTFEED_SKIP_NATIVE=1, so pip does not compile the core again);
# - only pillow-simd is built from source (`--no-binary pillow-simd`, not `:all:`, which also forced its build
#   dependencies -- pybind11, CMake -- to compile: 77 minutes on a fresh 2-core machine);
# - pillow-simd replaces Pillow's `PIL`, so it goes in last, after everything that pulls Pillow, and nothing runs
#   pip after it; the last line fails the install if `PIL` is not the package we meant to end with.
$(VENV)/.installed: pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip wheel setuptools pybind11
	rm -rf $(VENV)/wheels
	CC="cc -mavx2" $(BIN)/pip wheel -q --no-deps --no-binary pillow-simd pillow-simd -w $(VENV)/wheels \
	  > $(VENV)/pillow-simd.log 2>&1 & simd=$$!; \
	$(BIN)/python setup.py -q build_ext --inplace > $(VENV)/native.log 2>&1 & native=$$!; \
	$(BIN)/pip install -q $(TORCH_PINS) && $(BIN)/pip install -q $(DALI_PIN) \
	  && { wait $$native || { cat $(VENV)/native.log; false; }; } \
	  && FASTFEED_SKIP_NATIVE=1 $(BIN)/pip install -q --no-build-isolation -e '.[dev,bench]' \
	  || { kill $$simd $$native 2>/dev/null; exit 1; }; \
	$(BIN)/pip uninstall -q -y pillow; \
	if wait $$simd; then $(BIN)/pip install -q --no-deps --force-reinstall $(VENV)/wheels/pillow_simd-*.whl; \
	else cat $(VENV)/pillow-simd.log; echo "pillow-simd did not build; falling back to Pillow"; \
	  $(BIN)/pip install -q --no-deps Pillow; fi
	$(BIN)/python tools/check_pil.py
	touch $@

build: $(NATIVE)

# The venv is an order-only prerequisite: the install above already built the core in place, so a fresh setup
# compiles csrc/ once, not twice.
$(NATIVE): setup.py $(wildcard csrc/*) | $(VENV)/.installed
	$(BIN)/python setup.py -q build_ext --inplace
	touch $@

demo: setup
	$(BIN)/fastfeed demo-data $(DATA)/sample --num-images $(SAMPLE_IMAGES) --seed 0
	$(BIN)/fastfeed pack $(DATA)/sample $(DATA)/sample-wds --format wds --shard-size 64MB --overwrite
	$(BIN)/fastfeed pack $(DATA)/sample $(DATA)/sample-lmdb --format lmdb --overwrite
	$(BIN)/fastfeed verify $(DATA)/sample-wds
	$(BIN)/fastfeed verify $(DATA)/sample-lmdb
	$(BIN)/fastfeed bench $(DATA)/sample-wds --steps 100 --batch-size 64 --compare torch

# Every tier (CI's command): the unit tier, `integration` (frameworks, servers, Ray, subprocesses, multi-process
# runs) and `sanitize`; the `gpu` tests skip themselves on a machine without CUDA, such as CI. One worker per core
# (pytest-xdist, a test file per worker), then the `serial` tests alone: they compare timings, which a neighbour
# would skew.
test: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -q -m serial

# The unit tier, after every edit: no subprocess, no server, under 2 minutes on 2 cores.
test-fast: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not integration and not sanitize and not gpu and not serial"
	$(BIN)/python -m pytest -q -m "serial and not integration"

# The ring tests against an AddressSanitizer/UBSan build of the native core (run after any csrc/ change).
test-sanitize: $(VENV)/.installed
	bash tools/sanitize.sh

clean:
	rm -rf build fastfeed/_native*.so $(DATA)
