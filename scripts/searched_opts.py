#!/usr/bin/env python3
"""The opts a BEAM search chose, from its ledger (BEAM_LEDGER=FILE, one JSON line a kernel), as scripts/step_opts.py's
overrides (--kernels FILE): a BEAM=0 bench with them runs the searched layouts of just those kernels, the rest on the hand-coded
opts. That tells which kernels' searches a step's speed owes its gain to, timed in the step (a ledger's times are each
kernel's alone, which did not rank layouts in the step: docs/PERF.md, twenty-ninth session), and which layouts a
hand-coded rule would have to give so that a prewarm need not search them (issue 25).
  python3 searched_opts.py LEDGER [--min-gain 0.05] [--match REGEX] [--list] > KERNELS
--min-gain: only kernels whose searched time (alone) is at least this share under the hand-coded one (default 0.05);
--match: only kernels whose name matches (e.g. '^r_2048$|_8_4_1024_32_2$'); --list: a table to stderr as well.
LEDGER may be xz-compressed (docs/data/ keeps the ledgers measured).
Prints one SHAPE=OPTS a line, for `step_opts.py --kernels KERNELS -- bench --beam 0 ...`."""
import argparse, json, lzma, re, sys

def split_name(name: str) -> tuple[str, list[str]]:
  """A kernel's name (r_4_8_2048_72_((start_pos+255)//256*64+128)) -> its kind and sizes, a symbolic size whole: an
  expression in parentheses, or a variable's bare name, which may hold `_` itself (E_group_blocks_4096_256: the
  engine's start_pos, chunk_len, hist_row, group_blocks). Parts that begin with a letter and follow each other are one
  name (no kernel's name has two bare variables side by side)."""
  kind, parts, depth, cur = name[0], [], 0, ""
  if kind not in "rE" or name[1:2] != "_": raise ValueError(f"{name!r}: not a kernel's name (r_... or E_...)")
  for ch in name[2:]:
    depth += (ch == "(") - (ch == ")")
    if ch == "_" and depth == 0: parts.append(cur); cur = ""
    else: cur += ch
  parts.append(cur)
  sizes: list[str] = []
  for p in parts:
    if not p: raise ValueError(f"{name!r}: an empty size")
    if p[0].isalpha() and sizes and sizes[-1][0].isalpha(): sizes[-1] += "_" + p
    else: sizes.append(p)
  return kind, sizes

def shape_key(name: str) -> str:
  """step_opts' key of a ledger's kernel: its kind, then its sizes, `?` for a symbolic one."""
  kind, sizes = split_name(name)
  return f"{kind}:" + ",".join(s if s.isdigit() else "?" for s in sizes)

def opt_text(opt: str) -> str:
  """`Opt(op=OptOps.UPCAST, axis=0, arg=4)` (the ledger's) -> `UPCAST:0:4` (step_opts'); a tensor core's
  `arg=(-1, 0, 1)` -> `TC:0:-1/0/1`."""
  m = re.fullmatch(r"Opt\(op=OptOps\.(\w+), axis=(-?\d+|None), arg=(-?\d+|\((?:-?\d+, )*-?\d+\))\)", opt.strip())
  if m is None: raise ValueError(f"{opt!r}: not an opt step_opts can take")
  op, axis, arg = m.groups()
  if arg.startswith("("): arg = "/".join(x.strip() for x in arg[1:-1].split(","))
  return f"{op}:{0 if axis == 'None' else axis}:{arg}"

def overrides(rows: list[dict], min_gain: float = 0.05, match: str | None = None) -> tuple[dict[str, str], list[str]]:
  """{step_opts key: opts} of the searched kernels that gained at least min_gain alone, and the reasons others were left
  out. Two layouts of one key: the one that gained more time a step (time x uses, its best row) is kept."""
  gains: dict[str, dict[str, float]] = {}  # key -> opts -> the most time a step it gained
  notes = []
  for r in rows:
    if r.get("skipped_small") or r.get("kept_heuristic") or not r.get("opts"): continue
    if match and not re.search(match, r["name"]): continue
    h, f = r.get("heuristic_us"), r.get("final_us")
    if not isinstance(h, (int, float)) or not isinstance(f, (int, float)) or h <= 0 or (h - f) / h < min_gain: continue
    try: key, opts = shape_key(r["name"]), ",".join(opt_text(o) for o in r["opts"])
    except ValueError as e: notes.append(f"{r['name']}: left out, {e}"); continue
    layouts = gains.setdefault(key, {})
    layouts[opts] = max(layouts.get(opts, float("-inf")), (h - f) * r.get("uses", 1))
  out = {}
  for key, layouts in gains.items():
    out[key] = max(layouts, key=layouts.__getitem__)
    if len(layouts) > 1: notes.append(f"{key}: {len(layouts)} searched layouts, the one that gained {layouts[out[key]]:.1f} us a step kept")
  return out, notes

def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("ledger")
  ap.add_argument("--min-gain", type=float, default=0.05)
  ap.add_argument("--match")
  ap.add_argument("--list", action="store_true")
  a = ap.parse_args(argv)
  with (lzma.open if a.ledger.endswith(".xz") else open)(a.ledger, "rt") as fh: rows = [json.loads(line) for line in fh if line.strip()]
  out, notes = overrides(rows, a.min_gain, a.match)
  for n in notes: print(f"searched_opts: {n}", file=sys.stderr)
  if a.list:
    for r in rows:
      if r.get("skipped_small") or not r.get("opts"): continue
      try: k, opts = shape_key(r["name"]), ",".join(opt_text(o) for o in r["opts"])
      except ValueError: k = opts = None
      t = lambda v: f"{v:8.1f}" if isinstance(v, (int, float)) else f"{str(v):>8s}"
      print(f"searched_opts: {r['name'][:48]:48s} x{r.get('uses', 1):<3d} {t(r.get('heuristic_us'))} -> {t(r.get('final_us'))} us"
            f"{'  taken' if k is not None and out.get(k) == opts else ''}", file=sys.stderr)
  for k, v in out.items(): print(f"{k}={v}")

if __name__ == "__main__": main()
