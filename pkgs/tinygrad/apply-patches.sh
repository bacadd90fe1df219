#!/bin/sh
# Applies orin_llm's tinygrad patch series to an unpacked tinygrad source tree and records
# which patches went in. Used by both the Python setup (scripts/setup_venv.py) and the Nix
# derivation (pkgs/tinygrad/default.nix), so both builds carry the same files.
#   apply-patches.sh SRC_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$1
marker="$src/tinygrad/orin_llm_patches.py"
[ -e "$marker" ] && { echo "apply-patches: $src is already patched" >&2; exit 1; }
names=""
for p in "$here"/patches/*.patch; do
  [ -e "$p" ] || continue
  patch -p1 -d "$src" --forward --batch --quiet < "$p" || { echo "apply-patches: $(basename "$p") does not apply" >&2; exit 1; }
  names="$names\"$(basename "$p")\", "
done
# The marker is checked at import by orin_llm (orin_llm/tinygrad_check.py) and by the tests.
printf '# Written by orin_llm pkgs/tinygrad/apply-patches.sh: the patch series applied to this tinygrad.\nPATCHES = (%s)\n' "$names" > "$marker"
