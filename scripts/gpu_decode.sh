#!/usr/bin/env bash
# On the GPU machine: install the carried wheels, make the 1B-shaped Q6_K file, run the bench
# side by side with llama.cpp and a per-kernel profile. Output under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD DEV=CUDA PYTHONUNBUFFERED=1 BEAM_MP_CTX=fork  # fork: BEAM workers skip re-importing tinygrad (patch 0001)
M=/tmp/llama1b-q6k.gguf
[ -f /tmp/vocab.gguf ] || xz -dc .dev/vocab.gguf.xz > /tmp/vocab.gguf  # carried compressed: the carry is capped at 64 MiB
[ -f $M ] || { time python3 -m orin_llm synth --preset llama-3.2-1b --type Q6_K --vocab /tmp/vocab.gguf -o $M; }
# tinygrad's kernel cache (BEAM results included): brought along from the last run, sent back after this one
export CACHEDB=/tmp/beam.db
[ -f .dev/beam.db.xz ] && [ ! -f $CACHEDB ] && xz -dc .dev/beam.db.xz > $CACHEDB
trap 'xz -9e -T16 -c $CACHEDB > $OUT/beam.db.xz 2>/dev/null' EXIT
LB=$(bash .baseline/llama-baseline.sh | head -1)/llama-bench
eval "$1"
