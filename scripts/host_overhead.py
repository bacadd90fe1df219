#!/usr/bin/env python3
"""Is the decode loop host-bound? Times the host side of queueing compiled decode steps (no sync)
against the wall time of the same steps once the device has finished them.
  host_overhead.py MODEL [--steps N]"""
import argparse, time
from orin_llm.engine import Engine
from orin_llm.sampling import Sampling

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--steps", type=int, default=16)
a = ap.parse_args()
eng = Engine(a.model, max_context=512)
for _ in eng.generate(list(range(1, 40)), 24, Sampling(), lookahead=4): pass
step, choose, pos = eng._jit("decode"), eng._jit("choose", True), len(eng.cached)
for trial in range(3):
  eng.tok_buf[pos].item()  # device idle
  t0 = time.perf_counter()
  for i in range(a.steps): step(eng.v_pos.bind(pos + i)); choose(eng.v_next.bind(pos + i + 1))  # as Engine.decode
  t1 = time.perf_counter()
  eng.tok_buf[pos + a.steps].item()
  t2 = time.perf_counter()
  print(f"{a.steps} steps: host queueing {1e6 * (t1 - t0) / a.steps:.0f} us/step, wall {1e6 * (t2 - t0) / a.steps:.0f} us/step")
