#!/usr/bin/env bash
# On the GPU machine: install the carried wheels, make the model file $M, run the command given
# (e.g. the bench side by side with llama.cpp, a per-kernel profile). Output under $OUT.
#   [MODEL=NAME] bash scripts/gpu_decode.sh '<command using $M, $LB, $LS>'
# $M: MODEL=NAME (e.g. llama-3.2-1b-Q6_K, qwen3-1.7b-Q4_K_M; scripts/make_models.sh lists them) picks
# $MODELS_DIR/NAME.gguf (default /tmp/models), made as users' files are (F16, then llama-quantize) if
# missing; without MODEL, the 1B-shaped file of random Q6_K blocks of the runs in docs/PERF.md so far.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD DEV=CUDA PYTHONUNBUFFERED=1  # BEAM workers: kernel_cache.search_defaults() (forkserver)
[ -f /tmp/vocab.gguf ] || xz -dc .dev/vocab.gguf.xz > /tmp/vocab.gguf  # carried compressed: the carry is capped at 64 MiB
if [ -n "${MODEL:-}" ]; then
  M=${MODELS_DIR:-/tmp/models}/$MODEL.gguf
  [ -f $M ] || bash scripts/make_models.sh "$MODEL" || exit 1
else
  M=/tmp/llama1b-q6k.gguf
  [ -f $M ] || { time python3 -m orin_llm synth --preset llama-3.2-1b --type Q6_K --vocab /tmp/vocab.gguf -o $M; }
fi
# tinygrad's kernel cache (BEAM results included): brought along from the last run, sent back after this one
export CACHEDB=/tmp/beam.db
[ -f .dev/beam.db.xz ] && [ ! -f $CACHEDB ] && xz -dc .dev/beam.db.xz > $CACHEDB
# KC=DIR: the database a prewarm makes in DIR is the one sent back (its name is known once it exists). The write-ahead
# log is folded in first: a process killed mid-search leaves its newest results there.
trap 'db=${KC:+$(ls $KC/kernels-*.db 2>/dev/null | head -1)}; db=${db:-$CACHEDB}; python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute(\"pragma wal_checkpoint(TRUNCATE)\")" $db 2>/dev/null; xz -3 -T16 -c $db > $OUT/beam.db.xz 2>/dev/null' EXIT
LL=$(bash .baseline/llama-baseline.sh | head -1)
LB=$LL/llama-bench LS=$LL/llama-server  # llama-bench for `orin-llm bench`, llama-server for scripts/load_bench.py
eval "$1"
