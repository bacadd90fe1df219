#!/usr/bin/env bash
# On the GPU machine: benchmark files made the way users get theirs. `orin-llm synth --type F16` writes
# an F16 file with the model's real shapes (random weights, real vocabulary), and llama.cpp's
# llama-quantize turns it into the file users download (Q4_K_M: its mix of Q4_K and Q6_K; Q6_K; Q8_0).
#   make_models.sh [--dir DIR] [--rm-f16] [NAME ...]
# NAME is PRESET-TYPE, e.g. llama-3.2-1b-Q6_K (PRESET: `orin-llm synth --preset`; TYPE: llama-quantize's);
# no NAME: all of the seed set below. Makes DIR/NAME.gguf (DIR: $MODELS_DIR, else /tmp/models) unless it
# exists, from DIR/PRESET-F16.gguf (written unless it exists). --rm-f16 deletes an F16 file once no later
# NAME needs it (8B: 16 GB of the machine's 64). Prints timings. Needs orin_llm importable (run it under
# gpu_decode.sh) and llama-quantize ($LLAMA_QUANTIZE, else the baseline's from .baseline/).
set -euo pipefail
dir=${MODELS_DIR:-/tmp/models} rm_f16=0 names=()
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2;;
    --rm-f16) rm_f16=1; shift;;
    -h|--help) sed -n '2,10p' "$0"; exit 0;;
    *) names+=("$1"); shift;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(qwen3-0.6b-Q8_0 qwen3-1.7b-Q4_K_M llama-3.2-1b-Q6_K llama-3.2-1b-Q4_K_M llama-3.2-3b-Q4_K_M
                                 llama-3.1-8b-Q4_K_M llama-3.1-8b-Q6_K)
LQ=${LLAMA_QUANTIZE:-$(bash .baseline/llama-baseline.sh | sed -n 1p)/llama-quantize}  # sed, not head: no SIGPIPE under pipefail
mkdir -p "$dir"
vocab() {  # the family's vocabulary: $LLAMA_VOCAB / $QWEN_VOCAB, else carried compressed in .dev/ (device_bundle.sh)
  case $1 in
    qwen*) v=${QWEN_VOCAB:-/tmp/vocab-qwen2.gguf}; [ -f "$v" ] || xz -dc .dev/vocab-qwen2.gguf.xz > "$v";;
    *) v=${LLAMA_VOCAB:-/tmp/vocab.gguf}; [ -f "$v" ] || xz -dc .dev/vocab.gguf.xz > "$v";;
  esac
  echo "$v"
}
ms() { echo $(( $(date +%s%N) / 1000000 )); }
since() { awk -v a="$1" -v b="$(ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }  # seconds since $1 (ms)
for i in "${!names[@]}"; do
  name=${names[$i]} preset=${names[$i]%-*} type=${names[$i]##*-}
  out=$dir/$name.gguf f16=$dir/$preset-F16.gguf
  if [ -f "$out" ]; then echo "$out: exists"
  else
    if [ ! -f "$f16" ]; then  # written under another name first: a run cut off at its time limit leaves no half file behind
      t=$(ms); ${PYTHON:-python3} -m orin_llm synth --preset "$preset" --type F16 --vocab "$(vocab "$preset")" -o "$f16.part" > /dev/null
      mv "$f16.part" "$f16"; echo "$f16: written in $(since "$t") s ($(du -h "$f16" | cut -f1))"
    fi
    t=$(ms)
    if ! "$LQ" "$f16" "$out.part" "$type" > "$dir/$name.quantize.log" 2>&1; then
      tail -n 20 "$dir/$name.quantize.log"; echo "$out: llama-quantize failed (log: $dir/$name.quantize.log)"; exit 1
    fi
    mv "$out.part" "$out"; echo "$out: quantized in $(since "$t") s ($(du -h "$out" | cut -f1))"
  fi
  later=0
  for n in "${names[@]:$((i + 1))}"; do [ "${n%-*}" = "$preset" ] && later=1; done
  if [ $rm_f16 = 1 ] && [ $later = 0 ] && [ -f "$f16" ]; then rm "$f16"; echo "$f16: removed"; fi
done
