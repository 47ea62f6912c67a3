# The two entry points of the README: `make demo` (the main job) and `make test`.
# Both set everything up on a fresh Debian machine, idempotently: apt packages (prometheus and
# chromium for the tests of deploy/ and of the status page), a
# virtual environment with torch 2.13.0 (CPU), and the extension build.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
APT_PACKAGES := g++ cmake ninja-build ccache patch libgtest-dev libbenchmark-dev libeigen3-dev nlohmann-json3-dev \
  prometheus chromium
NPROC ?= 2
DEMO_DIR ?= runs/demo
# Compiler output and pip's go to logs under build/logs; the terminal gets one line per
# phase, and a log's last lines when its phase fails. VERBOSE=1 prints everything;
# DEBUG_INFO=1 compiles the extensions with debug info (-g).
LOGS := build/logs
# ccache, with paths under this checkout hashed relative to it: a clone elsewhere hits the
# same cache entries.
export PATH := /usr/lib/ccache:$(PATH)
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
# $(call logged,NAME,COMMAND): COMMAND with its output in $(LOGS)/NAME.log (printed instead
# under VERBOSE=1); when it fails, the log's last 40 lines and its path.
logged = $(if $(VERBOSE),$(2),{ $(2); } >>$(LOGS)/$(1).log 2>&1 || { tail -n 40 $(LOGS)/$(1).log; \
  echo "failed: $(2) (full log: $(LOGS)/$(1).log)"; exit 1; })

.PHONY: all setup apt venv build build-locked cpp-build cpp-test py-test py-test-detections py-test-runs test demo \
  bench clean

all: test

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  sudo=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  echo "installing apt packages:" $$missing; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

$(VENV)/.deps: requirements.txt
	@mkdir -p $(LOGS) && : > $(LOGS)/setup.log
	@echo "setting up $(VENV): torch 2.13.0 (CPU) and requirements.txt (log: $(LOGS)/setup.log)"
	@[ -x $(PY) ] || $(call logged,setup,python3 -m venv $(VENV))
	@$(call logged,setup,$(PIP) install -q --upgrade pip)
	@$(call logged,setup,$(PIP) install -q torch==2.13.0)
	@$(call logged,setup,$(PIP) install -q -r requirements.txt)
	@touch $@

venv: $(VENV)/.deps

setup: apt venv

# The extension is built in place (ninja keeps build/temp.* so rebuilds are incremental);
# the package is installed once in editable mode without building it again. The lock
# serializes builds started from several shells in one checkout.
build: setup
	@flock /tmp/relax_straggler-build.lock $(MAKE) --no-print-directory build-locked

build-locked:
	@mkdir -p $(LOGS)
	@RELAX_STRAGGLER_BUILD_LOG=$(if $(VERBOSE),,$(LOGS)/extension.log) RELAX_STRAGGLER_DEBUG_INFO=$(DEBUG_INFO) \
	  $(PY) setup.py -q build_ext --inplace
	@[ -f $(VENV)/.editable ] || { $(call logged,setup,RELAX_STRAGGLER_NO_EXT=1 $(PIP) install -q \
	  --no-build-isolation --no-deps -e .) && touch $(VENV)/.editable; }

# The CUPTI collector is compiled and its no-device tests run where the CUDA toolkit is.
CUPTI_CHECK := $(if $(wildcard /usr/local/cuda/include/cupti.h),ON,OFF)

cpp-build: apt
	@mkdir -p $(LOGS) && : > $(LOGS)/engine.log
	@echo "building the C++ engine, its tests and benchmarks: build/core (log: $(LOGS)/engine.log)"
	@$(call logged,engine,cmake -S . -B build/core -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DRS_CUPTI_COMPILE_CHECK=$(CUPTI_CHECK))
	@$(call logged,engine,cmake --build build/core -j $(NPROC))

cpp-test: cpp-build
	ctest --test-dir build/core --output-on-failure

# Two passes (tests/python/conftest.py): first, on two pytest workers, the tests that neither
# run training processes nor measure CPU shares; then those, in two streams, each one test at a
# time: the detections, and the rest. The streams run side by side where the host's other
# processes leave about four cores free (tests/python/free_cores.py), one after the other
# otherwise (on 2 cores); each prints its output when it ends (both run, whether or not the first fails),
# and they share no pytest cache. py-test runs them once the build is done. -rs lists the
# skipped tests with their reasons.
PASS2 := $(PY) -m pytest -rs -p no:cacheprovider tests/python -m
STREAMS := --no-print-directory --keep-going --output-sync=target py-test-detections py-test-runs
py-test: build
	$(PY) -m pytest -rs -n 2 -m "not one_at_a_time" tests/python
	@echo "the tests that run training processes or measure CPU shares, in two streams (detections, the rest):"
	@$(PY) tests/python/free_cores.py; case $$? in \
	  0) echo "side by side; each prints when it ends"; $(MAKE) $(STREAMS) -j 2;; \
	  1) echo "one after the other (fewer than four cores free)"; $(MAKE) $(STREAMS) -j 1;; \
	  *) echo "tests/python/free_cores.py failed"; exit 1;; esac

py-test-detections:
	$(PASS2) "one_at_a_time and detection"

py-test-runs:
	$(PASS2) "one_at_a_time and not detection"

test: cpp-test py-test

demo: build
	@rm -rf $(DEMO_DIR)
	$(VENV)/bin/torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29577 \
	  examples/train_gpt.py --straggler-analysis --straggler-console --output $(DEMO_DIR)

bench: cpp-build build
	./build/core/rs_core_bench

clean:
	rm -rf build relax_straggler/_C*.so *.egg-info $(VENV)/.editable
