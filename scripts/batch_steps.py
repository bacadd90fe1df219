#!/usr/bin/env python3
"""The engine's decode rate with B sequences at once, without the server: each of B slots prefilled with a short
prompt, then rounds of 16 decode steps of all B (Engine.decode, as the server's worker runs them, the next round
queued ahead), timed on the host. What a batch step costs on the device, to set beside the load bench's aggregate
(the server's overhead is the difference). Then, for each B, the model step's graph census (its nodes, those whose
parameters are set again on every call) and the model step and the greedy choice each alone, 200 calls back to back.
--short-keys 512,0: each size timed under each bound of the short steps in turn (Engine.short_keys; one process, so
the kernels both kinds share compile once; the default: the engine's bound alone).
  batch_steps.py MODEL [--context 4352] [--max-batch 8] [--sizes 1,2,4,8] [--rounds 8] [--prompt 16] [--short-keys LIST]
                 [--cache DIR]"""
import argparse, statistics, time
import numpy as np
from orin_llm import settings
settings.search_defaults()  # a BEAM run searches as the server does
from tinygrad import Device
from tinygrad.engine.realize import graph_cache
from orin_llm.engine import Engine, HIST

def open_engine(model, cache: str | None, **kw) -> Engine:
  """Engine(model, **kw); with cache (a directory), its kernel database, repacked planes and captured steps kept there
  (kernel_cache.prepare, step_cache), so that the same command run again loads the steps keep_steps wrote rather than
  compiling them: on the GPU machine an 8B process spent ~2 of its ~2.5 minutes compiling (docs/PERF.md, forty-ninth
  session). A step the file lacks is compiled on first use, as in the server."""
  if not cache: return Engine(model, **kw)
  from orin_llm import kernel_cache
  return Engine(model, kernel_db=kernel_cache.prepare(model, cache), **kw)

def keep_steps(eng):
  """Writes the steps this process captured to the cache's steps file (open_engine), unless one was loaded or exists."""
  from orin_llm import step_cache
  if (path := step_cache.try_save(eng)) is not None: print(f"captured steps kept in {path}", flush=True)

def prefill_slots(eng, B: int, prompt: int, rng) -> list[int]:
  """Slots 0..B-1 each prefilled with a fresh random prompt of this many tokens (B: 1 or a compiled batch size)."""
  assert B == 1 or B in eng.batch_sizes, f"{B} rows: the engine compiles batches of {eng.batch_sizes} (and 1)"
  slots = list(range(B))
  for s in slots: eng.reset(s); eng.prefill(s, rng.integers(0, eng.cfg.vocab_size, prompt).tolist())
  return slots

def model_step(eng, B: int):
  """The captured model step of B rows at the slots' current positions: (its TinyJit, a call of it, its variables'
  values), bound as Engine.decode binds them (the same keys written again on each call)."""
  pos = [len(eng.slots[s].cached) for s in range(B)]
  if B == 1:
    vals = {eng.v_pos: pos[0], eng.v_slot: 0, eng.v_len: 1}
    jit = eng.steps.chunk(1, eng.key_blocks(pos[0] + 1)[0])
  else:
    short, block, nb = eng.key_blocks(max(pos) + 1)  # as Engine.batch_step binds them
    vals = dict(zip(eng.v_rows, pos)) | {nb: (max(pos) + block) // block}
    jit = eng.steps.batch(B, short)
  return jit, lambda: jit(*[v.bind(p) for v, p in vals.items()]), {v.expr: p for v, p in vals.items()}

def main():
  ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--context", type=int, default=4352)
  ap.add_argument("--max-batch", type=int, default=8); ap.add_argument("--sizes", default="1,2,4,8")
  ap.add_argument("--rounds", type=int, default=8); ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--short-keys", help="bounds of the short steps to time each size under, comma-separated (default: the engine's)")
  ap.add_argument("--cache", help="a directory for the kernels and captured steps: a second run loads them (open_engine)")
  a = ap.parse_args()
  rng = np.random.default_rng()
  eng = open_engine(a.model, a.cache, max_context=a.context, max_batch=a.max_batch)
  bounds = [int(k) for k in a.short_keys.split(",")] if a.short_keys else [eng.short_keys]
  for B, bound in [(int(b), k) for b in a.sizes.split(",") for k in bounds]:
    eng.short_keys = bound
    slots = prefill_slots(eng, B, a.prompt, rng)
    eng.decode(slots, HIST, ahead=True)  # compiles (first use) and warms
    times = []
    for _ in range(a.rounds):
      st = time.perf_counter(); eng.decode(slots, HIST, ahead=True); times.append(time.perf_counter() - st)
    step = statistics.median(times) / HIST
    jit, model, _ = model_step(eng, B)
    calls = jit.captured.linear.src if jit.captured is not None else ()
    runners = [graph_cache.get(c.src[0]) for c in calls if c.src[0].arg == "graph"]
    runners = [r for r in runners if r is not None and hasattr(r, "updatable")]
    if runners:  # the model step's graphs: their kernels, and those whose parameters are set again on each call
      print(f"  the model step: {len(calls)} calls, {len(runners)} graphs of {sum(len(r.calls) for r in runners)} nodes, "
            f"{sum(len(r.updatable) for r in runners)} updated each call")
    # the model step and the choice apart, each called back to back at the slots' positions
    pos = [len(eng.slots[s].cached) for s in slots]
    if B == 1: choose = lambda: eng.steps.choose("one", True)(eng.v_pos.bind(pos[0] + 1), eng.v_slot.bind(0), eng.v_row.bind(0))
    else: choose = lambda: eng.steps.choose(f"batch{B}", True)(*[v.bind(p + 1) for v, p in zip(eng.v_rows, pos)], eng.v_row.bind(0))
    for name, fn in (("model step", model), ("greedy choice", choose)):
      fn(); Device[eng.device].synchronize()
      st = time.perf_counter()
      for _ in range(200): fn()
      Device[eng.device].synchronize()
      print(f"  {name} alone: {(time.perf_counter() - st) / 200 * 1e3:.3f} ms a call (200 back to back)")
    print(f"B={B}{f' short_keys={bound}' if a.short_keys else ''}: {step * 1e3:.3f} ms a step (median of {a.rounds} rounds of {HIST}; spread "
          f"{min(times) / HIST * 1e3:.3f}-{max(times) / HIST * 1e3:.3f}), {B / step:.0f} tokens/s in all", flush=True)
  keep_steps(eng)

if __name__ == "__main__": main()
