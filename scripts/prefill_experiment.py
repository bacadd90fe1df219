#!/usr/bin/env python3
"""Prefill variants timed on the device, before one is adopted (issue: prefill speed). For each chunk size,
the prefill step (a constant number of rows, the last chunk padded) with its weights applied
  fused   dequantized inside each product, per row (what decode does)
  matmul  dequantized once per chunk into a float16 scratch, then a float16 product on tensor cores
          (quant.MATMUL_ROWS)
Prints tok/s of a long prompt, the time of a short one, and the logits' difference from those of the prompt run
one token at a time;
with --profile, the per-kernel breakdown of one chunk of the last variant.
  prefill_experiment.py MODEL [--prompt 512] [--short 20] [--chunks 32,128,512] [--variants fused,matmul]"""
import argparse, time
import numpy as np
from orin_llm import quant
from orin_llm.engine import Engine
from orin_llm.sampling import Sampling
from kernel_times import kernel_times, print_table

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--prompt", type=int, default=512)
ap.add_argument("--short", type=int, default=20); ap.add_argument("--chunks", default="32,128,512")
ap.add_argument("--variants", default="fused,matmul"); ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--profile", action="store_true")
ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=True, help="compare with the prompt run one token at a time")
ap.add_argument("--context", type=int, default=None, help="context (default prompt + 64; the bench's, 2240, reuses its BEAM results)")
a = ap.parse_args()

def prefill_time(eng, prompt) -> float:
  times = []
  for _ in range(a.reps):
    eng.cached = []
    t = time.perf_counter()
    next(iter(eng.generate(prompt, 1, Sampling())))
    times.append(time.perf_counter() - t)
  return min(times)

rng = np.random.default_rng(0)
eng = Engine(a.model, max_context=a.context or a.prompt + 64, chunk=1)  # the reference: the prompt one token at a time (decode's kernels)
prompt = rng.integers(0, eng.cfg.vocab_size, a.prompt).tolist()
if a.check: next(iter(eng.generate(prompt, 1, Sampling())))
ref = eng.logits.numpy() if a.check else None
for chunk in map(int, a.chunks.split(",")):
  for variant in a.variants.split(","):
    quant.MATMUL_ROWS = 1 << 30 if variant == "fused" else 64
    del eng
    eng = Engine(a.model, max_context=a.context or a.prompt + 64, chunk=chunk)
    t = time.perf_counter()
    prefill_time(eng, prompt[:a.short])  # compile and capture
    compile_s = time.perf_counter() - t
    long_s, short_s = prefill_time(eng, prompt), prefill_time(eng, prompt[:a.short])
    eng.cached = []
    next(iter(eng.generate(prompt, 1, Sampling())))
    err = err_plain = float("nan")
    if a.check:
      err = float(np.linalg.norm(eng.logits.numpy() - ref) / np.linalg.norm(ref))
      eng.cached = []
      plain = eng.forward(prompt, 0)  # the same graph uncompiled, the whole prompt as one chunk
      err_plain = float(np.linalg.norm(plain - ref) / np.linalg.norm(ref))
    print(f"chunk {chunk:4d} {variant:6s}: pp{a.prompt} {a.prompt / long_s:8.0f} tok/s ({long_s * 1e3:6.1f} ms), "
          f"{a.short} tokens {short_s * 1e3:6.1f} ms, compile {compile_s:5.1f} s, logits vs one at a time: rel diff {err:.1e} (uncompiled, one chunk: {err_plain:.1e})", flush=True)
if a.profile:
  step = lambda: eng._step(eng.v_pos.bind(0), eng.chunk, True, prefill=True, n=eng.v_len.bind(eng.chunk)).realize()
  step()
  print_table(kernel_times(step), f"one prefill chunk of {eng.chunk} (last variant)")
