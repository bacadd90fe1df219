# The two commands of the README: `make run` (set up, then answer a prompt with the default
# model) and `make test`. Everything else is a plain Python entry point in .venv/bin.
PROMPT ?= What is the capital of France? Answer in one sentence.

.venv/ready: pyproject.toml scripts/setup_venv.py pkgs/tinygrad/source.env pkgs/tinygrad/apply-patches.sh $(wildcard pkgs/tinygrad/patches/*.patch)
	python3 scripts/setup_venv.py --dev
	touch $@

run: .venv/ready
	.venv/bin/orin-llm generate --chat --prompt "$(PROMPT)"

# the tests run on tinygrad's CPU backend, which compiles every kernel with clang ($CC): said in one line before the set-up
test: clang .venv/ready
	DEV=CPU .venv/bin/python -m pytest -q --durations=25 tests

clang:
	@command -v "$${CC:-clang}" >/dev/null || { echo "make test: clang is not installed: the tests run on tinygrad's CPU backend, which compiles its kernels with it. Install clang (Debian/Ubuntu: apt-get install clang) or set CC to a clang binary." >&2; exit 1; }

.PHONY: run test clang
