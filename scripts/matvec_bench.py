#!/usr/bin/env python3
"""One quantized matvec alone, timed on the device: each variant of the int->float conversion
(orin_llm.quant.int_to_float), under the BEAM setting of the environment. Several weight copies are
rotated so that the timing is of device memory, not of L2.
  matvec_bench.py [--type Q6_K] [--rows 16384] [--cols 2048] [--iters 200] [--variants cast,magic] [--split N]"""
import argparse, time
import numpy as np
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor, TinyJit, dtypes, Device
from orin_llm import quant
from orin_llm.synth import random_blocks

def cast(u: Tensor) -> Tensor: return u.cast(dtypes.float32)  # I2F: a quarter of the FMA rate on NVIDIA GPUs

ap = argparse.ArgumentParser(); ap.add_argument("--type", default="Q6_K"); ap.add_argument("--rows", type=int, default=16384)
ap.add_argument("--cols", type=int, default=2048); ap.add_argument("--iters", type=int, default=200); ap.add_argument("--copies", type=int, default=6)
ap.add_argument("--variants", default="cast,magic", help="conversions to time (comma-separated): cast, magic (the model's)")
ap.add_argument("--split", type=int, default=1, help="the reduction split into this many partial sums, summed by a second kernel")
a = ap.parse_args()
if a.split > 1:  # split-K: rows x split independent partial sums (more parallel work for few rows), then a small sum
  def split_call(self, x):
    w = self.weights().reshape(self.rows, a.split, self.cols // a.split)
    return (x.reshape(x.shape[0], 1, a.split, self.cols // a.split) * w).sum(-1).contiguous().sum(-1)
  quant.QuantWeight.__call__ = split_call
qt, rng = QT[a.type], np.random.default_rng(0)
raws = [random_blocks(rng, qt, a.rows * a.cols) for _ in range(a.copies)]
x = Tensor(rng.normal(size=(1, a.cols)).astype(np.float32)).realize()
ref = None
for name, conv in [v for v in (("cast", cast), ("magic", quant.int_to_float)) if v[0] in a.variants.split(",")]:
  quant.int_to_float = conv
  ws = [quant.QuantWeight.from_raw(r, qt, a.rows, a.cols, Device.DEFAULT) for r in raws]
  nbytes = ws[0].nbytes()
  def all_copies(x):  # one graph of len(ws) kernels: launches back to back, no host gap between them
    outs = [w(x) for w in ws]
    Tensor.realize(*outs)
    return outs[0]
  f = TinyJit(all_copies)
  t0 = time.perf_counter()
  for _ in range(3): f(x)
  compile_s = time.perf_counter() - t0
  y = f(x).numpy()
  ref = y if ref is None else ref
  Device[Device.DEFAULT].synchronize()
  t0 = time.perf_counter()
  for i in range(a.iters // len(ws)): f(x)
  Device[Device.DEFAULT].synchronize()
  us = 1e6 * (time.perf_counter() - t0) / (a.iters // len(ws) * len(ws))
  err = float(np.abs(y - ref).max() / np.abs(ref).max())
  print(f"{a.type} {a.rows}x{a.cols} split {a.split} {name:6s}: {us:7.1f} us/matvec, {nbytes / us / 1e3:6.0f} GB/s ({nbytes / 2**20:.1f} MiB), compile {compile_s:.0f} s, max rel diff vs cast {err:.1e}")
