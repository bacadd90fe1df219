#!/usr/bin/env python3
"""One quantized matvec of the decoder's shapes under fixed kernel optimizations (tinygrad Opts, put in
place of the hand-coded heuristic's choice for the matvec kernel; run with BEAM=0), timed on the device: which work split suits a dequantizing
matvec, measured, to inform the matvec heuristic (patch 0003) and BEAM. Several weight copies are rotated
so that the timing is of device memory, not of L2.
  matvec_opts.py [--type Q6_K] [--shapes gate_up,down,qkv,wo,head]"""
import argparse, time
import numpy as np
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor, TinyJit, Device
from tinygrad.codegen.opt import Opt, OptOps
import tinygrad.codegen, tinygrad.codegen.opt.heuristic as heuristic
from orin_llm import quant
from orin_llm.synth import random_blocks

SHAPES = {"gate_up": (16384, 2048), "down": (2048, 8192), "qkv": (3072, 2048), "wo": (2048, 2048), "head": (128256, 2048)}
U, G, L, P = OptOps.UNROLL, OptOps.GROUP, OptOps.LOCAL, OptOps.UPCAST
# The dequantizing matvec's kernel shape before optimization: [rows | K/64, 4, 2, 8] (the reduce split by the plane
# layout: scale word, qh2 word, q4 word, nibble). W64 unrolls the last three: a thread takes 64 consecutive
# elements (two 16-byte q4 loads, one 16-byte qh2 load); W32 takes 32.
W64, W32 = [Opt(U, 3, 0), Opt(U, 2, 0), Opt(U, 1, 0)], [Opt(U, 3, 0), Opt(U, 2, 0), Opt(U, 1, 2)]
def cfg(base, group=0, up=0, local=0):
  return base + ([Opt(G, 0, group)] if group else []) + ([Opt(P, 0, up)] if up else []) + ([Opt(L, 0, local)] if local else [])
CONFIGS = {"heuristic": None, "w64g32": cfg(W64, 32), "w64g32l2": cfg(W64, 32, 0, 2), "w64g32l4": cfg(W64, 32, 0, 4),
           "w64g32l8": cfg(W64, 32, 0, 8), "w64g32p2": cfg(W64, 32, 2), "w64g32p2l2": cfg(W64, 32, 2, 2), "w64g32p2l4": cfg(W64, 32, 2, 4),
           "w64g16l4": cfg(W64, 16, 0, 4), "w64g16l8": cfg(W64, 16, 0, 8), "w64g8l8": cfg(W64, 8, 0, 8), "w64g64l2": cfg(W64, 64, 0, 2),
           "w64g128": cfg(W64, 128), "w32g32l4": cfg(W32, 32, 0, 4), "w32g16l4": cfg(W32, 16, 0, 4), "w64g32p4": cfg(W64, 32, 4),
           # a thread (or a few) per row, several rows per thread: x is loaded once for all of a thread's rows, and the
           # threads of a warp load the same x (a broadcast)
           "w64p4l32": cfg(W64, 0, 4, 32), "w64p2l32": cfg(W64, 0, 2, 32), "w64p4l16": cfg(W64, 0, 4, 16), "w64p8l16": cfg(W64, 0, 8, 16),
           "w64p8l32": cfg(W64, 0, 8, 32), "w64g2p4l16": cfg(W64, 2, 4, 16), "w64g4p4l8": cfg(W64, 4, 4, 8), "w64g4p2l16": cfg(W64, 4, 2, 16),
           "w64g4p8l8": cfg(W64, 4, 8, 8), "w64g8p4l4": cfg(W64, 8, 4, 4), "w32p4l32": cfg(W32, 0, 4, 32), "w32g4p4l8": cfg(W32, 4, 4, 8)}

ap = argparse.ArgumentParser(); ap.add_argument("--type", default="Q6_K"); ap.add_argument("--shapes", default="gate_up,down,qkv,wo,head")
ap.add_argument("--configs", default=",".join(CONFIGS)); ap.add_argument("--iters", type=int, default=240)
ap.add_argument("--show", action="store_true", help="print each matvec kernel's name and opts")
a = ap.parse_args()
current: list | None = None
stock = heuristic.hand_coded_optimizations
def chosen(k):
  if current is None or k.reduceop is None: return stock(k)
  for o in current: k.apply_opt(o)
  if a.show: print("   ", k.name if hasattr(k, "name") else "", k.full_shape, k.applied_opts)
  return k
heuristic.hand_coded_optimizations = chosen
qt, rng = QT[a.type], np.random.default_rng(0)
for shape in a.shapes.split(","):
  rows, cols = SHAPES[shape]
  copies = 1 if shape == "head" else max(2, int(6 * 2**24 // (rows * cols)))  # >= ~100 MB of weights in rotation
  ws = [quant.QuantWeight.from_raw(random_blocks(rng, qt, rows * cols), qt, rows, cols, Device.DEFAULT) for _ in range(min(copies, 12))]
  nbytes = ws[0].nbytes()
  # down reads SiLU(gate) * up, computed in the kernel as the engine does
  xin = Tensor(rng.normal(size=(2, cols) if shape == "down" else (1, cols)).astype(np.float32)).realize()
  ref = None
  for name in a.configs.split(","):
    current = CONFIGS[name]
    tinygrad.codegen.to_program_cache.clear()  # keyed by the kernel before optimization: the same for every config
    def all_copies(xin):
      x = (xin[0:1].silu() * xin[1:2]) if shape == "down" else xin
      outs = [w(x) for w in ws]
      Tensor.realize(*outs)
      return outs[0]
    try:
      f = TinyJit(all_copies)
      for _ in range(3): f(xin)
      y = f(xin).numpy()
    except Exception as e:
      print(f"{shape:8s} {name:12s} failed: {type(e).__name__}: {str(e)[:100]}"); continue
    ref = y if ref is None else ref
    Device[Device.DEFAULT].synchronize()
    n = max(1, a.iters // len(ws))
    t0 = time.perf_counter()
    for _ in range(n): f(xin)
    Device[Device.DEFAULT].synchronize()
    us = 1e6 * (time.perf_counter() - t0) / (n * len(ws))
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    print(f"{shape:8s} {rows}x{cols} {name:12s} {us:7.1f} us {nbytes / us / 1e3:6.0f} GB/s  diff {err:.0e}", flush=True)
