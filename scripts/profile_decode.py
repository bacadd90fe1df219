#!/usr/bin/env python3
"""Per-kernel breakdown of one decode step: runs the step uncompiled with tinygrad's DEBUG=2 timing
(each kernel synchronized and timed alone) and prints the kernels by time with their bytes and GB/s.
  profile_decode.py MODEL [--context N] [--pos P]"""
import argparse, contextlib, io, re, sys
from collections import defaultdict
from tinygrad.helpers import Context
from orin_llm.engine import Engine

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--context", type=int, default=704)  # the bench's context: same kernels, so BEAM results are reused
ap.add_argument("--pos", type=int, default=100); ap.add_argument("--top", type=int, default=25)
a = ap.parse_args()
eng = Engine(a.model, max_context=a.context)
with Context(BEAM=0): eng.forward(list(range(1, a.pos + 1)), 0)  # fill the cache; these concrete shapes need no search
step = lambda: eng._step(eng.v_pos.bind(a.pos - 1), 1, True).realize()  # the same kernels as the compiled step
step()  # compile everything once
buf = io.StringIO()
with contextlib.redirect_stdout(buf), Context(DEBUG=2): step()
rows = []
for line in re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()).splitlines():
  m = re.match(r"\*\*\* \S+\s+\d+\s+(\S+)\s+arg\s+\d+\s+mem\s+[\d.]+ GB tm\s+([\d.]+)(us|ms|s)/.*?([\d.]+)\|([\d.]+)\s+GB/s", line)
  if m: rows.append((m.group(1), float(m.group(2)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(3)], float(m.group(5))))
total = sum(r[1] for r in rows)
agg = defaultdict(lambda: [0, 0.0, 0.0])
for name, us, gbs in rows: a_ = agg[name]; a_[0] += 1; a_[1] += us; a_[2] += us * gbs
print(f"{len(rows)} kernels, {total:.0f} us of kernel time in one decode step (each kernel timed alone)")
print(f"{'kernel':48s} {'n':>4s} {'us total':>9s} {'%':>5s} {'GB/s':>7s}")
for name, (n, us, w) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.top]:
  print(f"{name:48s} {n:4d} {us:9.1f} {100 * us / total:5.1f} {w / us if us else 0:7.0f}")
