#!/usr/bin/env python3
"""A BEAM ledger's kernels (BEAM_LEDGER, patch 0012) beside another kernel database's results for the same kernels: the
opts a short search (or the hand-coded opts) chose against those of a full one, where the database has the kernel
(matched by the ledger's key, the first 8 bytes of beam_search's AST key). Shows which kernels a full search lays out
otherwise, to read before writing a hand-coded rule (docs/PERF.md, twenty-fifth session).
  ledger_opts.py LEDGER.jsonl DATABASE.db [--min-us 200]   (--min-us: hand-coded time x calls a step, at least)"""
import argparse, json, pickle, sqlite3
from tinygrad.codegen.opt import OptOps  # noqa: F401  (the database's values are pickled Opts)

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("ledger"); ap.add_argument("db"); ap.add_argument("--min-us", type=float, default=200)
a = ap.parse_args()
con = sqlite3.connect(a.db)
tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'beam_search_%'")]
db = {r[0].hex()[:16]: pickle.loads(r[1]) for t in tables for r in con.execute(f"SELECT ast, val FROM '{t}'")}
fmt = lambda opts: [f"{o.op.name}({o.axis},{o.arg})" for o in opts]
shown = found = 0
for line in open(a.ledger):
  e = json.loads(line)
  if e["key"] not in db: continue
  found += 1
  mine = [o.split("OptOps.")[1].split(",")[0] + "(" + o.split("axis=")[1].split(",")[0] + "," + o.split("arg=")[1][:-1] + ")" for o in e["opts"]]
  if mine == fmt(db[e["key"]]) or e["heuristic_us"] * e["uses"] < a.min_us: continue
  shown += 1
  print(f"{e['name'][:46]:46s} x{e['uses']:<3d} hand-coded {e['heuristic_us']:.1f} us, ledger {e['final_us']:.1f} us"
        f"{'' if e['skipped_small'] else ' (searched)'}\n    ledger   {mine}\n    database {fmt(db[e['key']])}")
print(f"{found} of the ledger's kernels in the database; {shown} laid out otherwise there (over {a.min_us:g} us a step)")
