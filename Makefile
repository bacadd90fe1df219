# The two commands of the README: `make run` (set up, then answer a prompt with the default
# model) and `make test`. Everything else is a plain Python entry point in .venv/bin.
PROMPT ?= What is the capital of France? Answer in one sentence.

.venv/ready: pyproject.toml scripts/setup_venv.py pkgs/tinygrad/source.env pkgs/tinygrad/apply-patches.sh $(wildcard pkgs/tinygrad/patches/*.patch)
	python3 scripts/setup_venv.py --dev
	touch $@

run: .venv/ready
	.venv/bin/orin-llm generate --chat --prompt "$(PROMPT)"

test: .venv/ready
	DEV=CPU .venv/bin/python -m pytest -q tests

.PHONY: run test
