#!/usr/bin/env python3
"""What each kind of kernel costs inside a compiled step's graph, where timing kernels alone measures the launch floor
(docs/PERF.md, twenty-sixth session: an 8-row step's 333 kernels summed to 7.9 ms alone, 3.5 ms in the graph). The
model step of B rows (engine.Steps.batch, or the one-row decode step) is captured as the server runs it; then, for each
kind of kernel (its name: every KV store of every layer is one kind), the step's kernels
without that kind are made into a graph again and timed, back to back, against the whole step rebuilt the same way. The
difference is what that kind costs in the graph. The numbers the ablated steps compute are wrong (a kernel's output is
missing), their time is what is measured. They run on the step's own buffers: they write the KV cache where the step
would (the prefilled slots' next position), nothing the measurement reads back.
--verify K: speculative decoding's verify step of K rows of one sequence (engine.Steps.verify) in place of a batch.
  graph_ablation.py MODEL [--context 4352] [--max-batch 8] [--rows 8 | --verify K] [--top 12] [--reps 200] [--cache DIR]"""
import argparse, re, statistics, time
from collections import defaultdict
import numpy as np
from orin_llm import settings
settings.search_defaults()  # a BEAM run takes the database's results as the server does
from tinygrad import Device
from tinygrad.uop.ops import Ops, UOp
from tinygrad.engine.jit import graph_split_rewrite
from tinygrad.helpers import JIT_BATCH_SIZE
from tinygrad.engine.realize import run_linear
from orin_llm.engine import HIST, VERIFY_SIZES
from batch_steps import prefill_slots, model_step, open_engine, keep_steps

def kernels(linear: UOp) -> list[UOp]:
  """The step's calls in order, each graph's calls in its place."""
  out = []
  for c in linear.src:
    if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph": out += list(c.src[0].src[0].src)
    else: out.append(c)
  return out

ANSI = re.compile(r"\x1b\[[0-9;]*m")
def name(call: UOp) -> str:
  """A kernel's name as profile_decode.py prints it: every layer's kernel of one kind has the same (every KV store of
  every layer, each layer's gate+up product)."""
  return ANSI.sub("", call.src[0].arg.name) if call.src[0].op is Ops.PROGRAM else str(call.src[0].op)

def rebuilt(calls: list[UOp]) -> UOp:
  """The calls made into graphs as the JIT makes a captured step's (batches of JIT_BATCH_SIZE, doubling)."""
  return graph_split_rewrite(UOp(Ops.LINEAR, src=tuple(calls)), max_batch_size=JIT_BATCH_SIZE.value)

def main():
  ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--context", type=int, default=4352)
  ap.add_argument("--max-batch", type=int, default=8); ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--top", type=int, default=12); ap.add_argument("--reps", type=int, default=200)
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--verify", type=int, default=0, help="the verify step of this many rows (engine.VERIFY_SIZES) instead")
  ap.add_argument("--cache", help="a directory for the kernels and captured steps: a second run loads them (batch_steps.open_engine)")
  a = ap.parse_args()
  eng, B = open_engine(a.model, a.cache, max_context=a.context, max_batch=a.max_batch), a.rows
  rng = np.random.default_rng()
  if a.verify:
    assert a.verify in VERIFY_SIZES, f"--verify {a.verify}: the engine compiles verify steps of {VERIFY_SIZES} rows"
    assert a.prompt + 4 * a.verify <= a.context, "--prompt too near --context: the verify steps would be cut short"
    prefill_slots(eng, 1, a.prompt, rng)
    B = a.verify
    for _ in range(3): eng.verify(0, rng.integers(0, eng.cfg.vocab_size, a.verify - 1).tolist())  # captures the step
    jit = eng.steps.verify(a.verify)
    var_vals = {eng.v_pos.expr: len(eng.slots[0].cached), eng.v_slot.expr: 0}
  else:
    slots = prefill_slots(eng, B, a.prompt, rng)
    eng.decode(slots, HIST)  # captures the step
    jit, _, var_vals = model_step(eng, B)
  keep_steps(eng)
  calls = kernels(jit.captured.linear)
  dev = Device[eng.device]
  graph = dev.graph is not None
  def timed(linear: UOp) -> float:
    run_linear(linear, var_vals, jit=True); dev.synchronize()  # builds the graph
    best = []
    for _ in range(3):
      st = time.perf_counter()
      for _ in range(a.reps): run_linear(linear, var_vals, jit=True)
      dev.synchronize(); best.append((time.perf_counter() - st) / a.reps)
    return min(best)
  groups = defaultdict(list)
  for i, c in enumerate(calls): groups[name(c)].append(i)
  whole = timed(rebuilt(calls))
  print(f"{B}-row {'verify ' if a.verify else ''}step: {len(calls)} kernels in {'a graph' if graph else 'order (no graph on this device)'}, rebuilt "
        f"whole: {whole * 1e3:.3f} ms a call ({a.reps} back to back, best of 3)")
  rows, drift = [], 0.0
  for k, idx in groups.items():
    drop = set(idx)
    t = timed(rebuilt([c for i, c in enumerate(calls) if i not in drop]))
    ref = timed(rebuilt(calls))  # the whole step again beside each ablation: a clock that drifts shows here
    rows.append((ref - t, k, len(idx)))
    drift = max(drift, abs(ref - whole) / whole)
  rows.sort(reverse=True)
  print(f"{'kernel (all of that name dropped)':48s} {'n':>4s} {'saved us':>9s} {'% step':>7s}")
  for saved, k, n in rows[:a.top]: print(f"{k:48s} {n:4d} {saved * 1e6:9.1f} {100 * saved / whole:7.1f}")
  print(f"sum of the savings: {sum(r[0] for r in rows) * 1e3:.3f} ms of {whole * 1e3:.3f}; the whole step's time moved by "
        f"up to {100 * drift:.1f}% between ablations (compare with batch_steps.py's 'model step alone')")

if __name__ == "__main__": main()
