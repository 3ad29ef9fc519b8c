# opforge: the README's commands. Each target installs what is missing, builds when a source
# changed, then does its job. PYTHON picks the interpreter (default: python3).
PYTHON ?= python3
OUT ?=
DIST ?= dist
STAMP := build/.opforge-built
TORCH_STAMP := build/.torch-version
ENV_STAMP := build/.build-env
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh') setup.py pyproject.toml

.PHONY: setup build wheel test test-fast test-transformers-release bench bench-full gpu-check cpp-example lint format clean FORCE

setup:
	@$(PYTHON) scripts/ensure_deps.py test bench

# Editable install; rebuilt when a C++/CUDA source, the build files, the installed torch or the
# build's variables (OPFORGE_CUDA, OPFORGE_DEBUG, TORCH_CUDA_ARCH_LIST) changed. pip runs with -v
# (without it, it shows nothing of the build) through scripts/build_progress.py, which shows the
# configuration and one line per compiled file ([done/total] file (min:s)), warnings and errors,
# a failure in full, and keeps the whole output in build/build.log.
build: $(STAMP)
$(STAMP): $(SOURCES) $(TORCH_STAMP) $(ENV_STAMP) | setup
	$(PYTHON) scripts/build_progress.py build/build.log -- \
	  $(PYTHON) -m pip install -v --no-build-isolation --no-deps -e .
	@mkdir -p build && touch $(STAMP)

# Rewritten only when torch's version changes, so that a torch upgrade triggers a rebuild.
$(TORCH_STAMP): FORCE | setup
	@mkdir -p build; v=$$($(PYTHON) -c 'import torch; print(torch.__version__)'); \
	  [ "$$v" = "$$(cat $@ 2>/dev/null)" ] || echo "$$v" > $@

# Rewritten only when one of the build's variables changes (e.g. OPFORGE_CUDA=1 after a CPU build).
BUILD_ENV = OPFORGE_CUDA=$(OPFORGE_CUDA) OPFORGE_DEBUG=$(OPFORGE_DEBUG) TORCH_CUDA_ARCH_LIST=$(TORCH_CUDA_ARCH_LIST)
$(ENV_STAMP): FORCE
	@mkdir -p build; [ "$(BUILD_ENV)" = "$$(cat $@ 2>/dev/null)" ] || echo "$(BUILD_ENV)" > $@

# A binary wheel in DIST for this Python and the installed torch, which its metadata pins (the C++
# ABI); CUDA kernels included when the build has them (OPFORGE_CUDA=0: the CPU wheel). -v shows the
# build configuration; --no-cache-dir keeps a copy of every build out of pip's cache. ninja's
# objects in build/temp.* are kept, so a rebuild compiles only what changed; build/lib.* is cleared
# so that nothing stale is packed. It leaves the editable build alone.
wheel:
	@$(PYTHON) scripts/ensure_deps.py
	rm -rf build/lib.* build/bdist.*
	$(PYTHON) -m pip wheel -v --no-cache-dir --no-build-isolation --no-deps -w $(DIST) .

# The whole suite; test-fast leaves out the tests marked slow (pyproject.toml's markers: the ones
# over ~2 s on 2 cores). PYTEST_ARGS adds pytest options, e.g. PYTEST_ARGS=--durations=20.
test: build
	$(PYTHON) -m pytest tests -q $(PYTEST_ARGS)

test-fast: build
	$(PYTHON) -m pytest tests -q -m "not slow" $(PYTEST_ARGS)

# The transformers tests (the model integrations, continuous batching) on another release than the
# one `setup` installs (default 5.17, the last before 5.24 changed continuous batching's contract):
# a venv in build/ over the installed packages with only that release (and what it pins differently,
# huggingface_hub < 2) on top; psutil because 5.17's continuous batching sizes its cache from it.
TRANSFORMERS_RELEASE ?= 5.17.0
TF_VENV = build/venv-transformers-$(TRANSFORMERS_RELEASE)
test-transformers-release: build
	@[ -x $(TF_VENV)/bin/python ] || $(PYTHON) -m venv --system-site-packages $(TF_VENV)
	$(TF_VENV)/bin/python -m pip install -q --disable-pip-version-check transformers==$(TRANSFORMERS_RELEASE) psutil
	$(TF_VENV)/bin/python -c 'import transformers as t; assert t.__version__ == "$(TRANSFORMERS_RELEASE)", t.__version__'
	$(TF_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_transformers.py tests/test_transformers_distributed.py $(PYTEST_ARGS)

bench: build
	$(PYTHON) -m opforge.bench $(if $(OUT),--out $(OUT))

bench-full: build
	$(PYTHON) -m opforge.bench --full $(if $(OUT),--out $(OUT))

# On a CUDA machine: build with all cores, every test (CUDA ones too), the full benchmark,
# a memcheck of the CUDA tests; logs and results under OUT (default benchmarks/results/<device>/).
# No `setup`: GPU machines may be offline, so it uses what is installed (torch, ninja, pytest).
gpu-check:
	PYTHON=$(PYTHON) OUT=$(OUT) bash scripts/gpu_check.sh

# libopforge with CMake, its installed package, and the C++ example run through ctest.
cpp-example: setup
	PYTHON=$(PYTHON) bash scripts/cpp_example.sh

# The C++/CUDA sources under clang-format (.clang-format; the pinned release from ensure_deps dev).
# The wheel's binary, not a clang-format on PATH (another release formats some lines differently).
CLANG_FORMAT = $(PYTHON) -c 'import clang_format, sys; sys.argv[0] = "clang-format"; clang_format.clang_format()'
CXX_SOURCES = git ls-files 'csrc/*.cpp' 'csrc/*.h' 'csrc/*.cu' 'csrc/*.cuh' 'examples/*.cpp' 'examples/*.h'

lint:
	@$(PYTHON) scripts/ensure_deps.py dev
	$(PYTHON) -m ruff check . && $(PYTHON) -m ruff format --check .
	$(CXX_SOURCES) | xargs $(CLANG_FORMAT) --dry-run --Werror

format:
	@$(PYTHON) scripts/ensure_deps.py dev
	$(PYTHON) -m ruff format . && $(PYTHON) -m ruff check --fix .
	$(CXX_SOURCES) | xargs $(CLANG_FORMAT) -i

clean:
	rm -rf build dist opforge/_C*.so opforge/_build_config.py bench-out *.egg-info
