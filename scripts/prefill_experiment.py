#!/usr/bin/env python3
"""Prefill variants, timed on the device before one is adopted (issue: prefill speed):
  fused  the engine as it is: each chunk's matmuls dequantize the weights inside the product, per token row
  fp16   each matrix dequantized once per chunk into float16 (a scratch buffer the JIT's memory planner reuses
         across layers), then an fp16 x fp16 -> fp32 matmul that tinygrad can map to tensor cores
for several chunk sizes; prints prefill tok/s of a long prompt and the logits' difference from `fused`.
  prefill_experiment.py MODEL [--prompt 512] [--chunks 32,128,512]"""
import argparse, time
import numpy as np
from tinygrad import dtypes
from orin_llm.engine import Engine
from orin_llm.quant import QuantWeight
from orin_llm.sampling import Sampling

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--prompt", type=int, default=512)
ap.add_argument("--chunks", default="32,128,512"); ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
fused_call = QuantWeight.__call__

def fp16_call(self, x):
  if x.shape[0] == 1: return fused_call(self, x)  # decode keeps the fused matvec
  w = self.weights().cast(dtypes.float16).contiguous()
  return x.cast(dtypes.float16).matmul(w.T, dtype=dtypes.float32)

from orin_llm.loader import open_model
prompt = np.random.default_rng(0).integers(0, open_model(a.model)[1].vocab_size, a.prompt).tolist()
ref = None
for chunk in map(int, a.chunks.split(",")):
  for name, call in (("fused", fused_call), ("fp16", fp16_call)):
    QuantWeight.__call__ = call
    eng = Engine(a.model, max_context=a.prompt + 64, chunk=chunk)
    times = []
    for _ in range(a.reps + 2):  # two to compile and capture
      eng.cached = []
      t = time.perf_counter()
      next(iter(eng.generate(prompt, 1, Sampling())))
      times.append(time.perf_counter() - t)
    eng.cached = []
    logits = eng.forward(prompt[:64], 0)
    ref = logits if ref is None else ref
    err = float(np.linalg.norm(logits - ref) / np.linalg.norm(ref))
    print(f"chunk {chunk:4d} {name:5s}: prefill {a.prompt / min(times[2:]):8.0f} tok/s, logits rel diff vs first {err:.1e}", flush=True)
    del eng
