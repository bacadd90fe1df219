#!/usr/bin/env bash
# Prepares what a run on the lent GPU machine needs beside the checkout (all git-ignored):
#   .whl/       the patched tinygrad (built from the pinned sdist + pkgs/tinygrad/patches) and gguf
#   .baseline/  the prebuilt llama.cpp from ../shared/baseline
#   .dev/       the Llama 3 and Qwen2/3 vocabularies from ../shared/data (xz), for `orin-llm synth`
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl .dev .baseline
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. pkgs/tinygrad/source.env
tar xzf ".cache/tinygrad-$TINYGRAD_VERSION.tar.gz" -C "$tmp"
sh pkgs/tinygrad/apply-patches.sh "$tmp/tinygrad-$TINYGRAD_VERSION"
python3 -m pip wheel -q --no-deps "$tmp/tinygrad-$TINYGRAD_VERSION" -w .whl
python3 -m pip download -q --no-deps --only-binary=:all: gguf==0.19.0 -d .whl
# structured output (issue 24): llguidance's binary wheel is for the stable ABI (cp39-abi3), which the machine's Python takes
python3 -m pip download -q --no-deps --only-binary=:all: "llguidance==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("llguidance"))')" -d .whl
cp ../shared/baseline/* .baseline/
xz -9e -T0 -c ../shared/data/ggml-vocab-llama-bpe.gguf > .dev/vocab.gguf.xz  # the carry is capped at 64 MiB
xz -9e -T0 -c ../shared/data/ggml-vocab-qwen2.gguf > .dev/vocab-qwen2.gguf.xz
du -sh .whl .baseline .dev
