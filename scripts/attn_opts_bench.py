"""Times the decode step's attention kernels (those over the symbolic key-block count) at one position under a grid of
opt lists on the GPU, beside the hand-coded opts and the kernel database's result, each compiled by BEAM's worker pool
and timed alone (the L2 cleared before each run, as a decode step meets the cache). What a decode attention kernel can
be made to do by opts alone, measured instead of guessed (docs/PERF.md, twenty-fourth session: the 8B's scores kernel
read the cache at ~170 GB/s at depth 4096). A one-layer file of the model's shapes is enough: every layer's attention
kernels are the same.
  DEV=CUDA python3 scripts/attn_opts_bench.py MODEL [--pos 4096] [--context 4352] [--kernel 0] [--json out.json]
--kernel i: the i-th such kernel of the step (0: the scores, then the segments' maxima and the product with V)."""
import argparse, itertools, json, os, re, statistics, sys, time
os.environ.setdefault("BEAM_MIN_US", "1e9")  # the database's result looked up, nothing searched
import numpy as np
sys.path.insert(0, ".")
from orin_llm import settings
settings.search_defaults()  # BEAM's worker pool and L2 scrub as the server's search has them
from tinygrad import Device
from tinygrad.device import Buffer
from tinygrad.uop.ops import AxisType
from tinygrad.codegen.opt import Opt, OptOps, KernelOptError
from tinygrad.codegen.opt.postrange import Scheduler, args_from_ast
from tinygrad.codegen.opt.heuristic import hand_coded_optimizations
from tinygrad.codegen.opt.search import _try_compile, _time_program, _ensure_buffer_alloc
from tinygrad.engine.worker import imap_unordered_watched
import tinygrad.codegen as cg
from render_kernels import step_kernels

def pre_opts(ast, ren):
  """The kernel's AST as the heuristic and BEAM see it (full_rewrite_to_sink's passes before apply_opts), and its name."""
  seen, orig = [], cg.apply_opts
  cg.apply_opts = lambda sink, ren, beam=0: (seen.append(sink), orig(sink, ren, beam))[1]
  try: sink = cg.full_rewrite_to_sink(ast, ren)
  finally: cg.apply_opts = orig
  return seen[0], re.sub(r"\x1b\[[0-9;]*m", "", sink.arg.name)

def grid(k0: Scheduler) -> list[Scheduler]:
  """The first reduce axis (a head's dimension, in pairs) unrolled by r (each lane then reads r consecutive pairs) and
  a GROUP of g lanes on it (none, 4..32), the last reduce axis unrolled whole; the widest global axis (the keys of a
  block) UPCAST by u and LOCAL by l; the other global axes of at most 8 (heads, a group's query heads) each LOCAL or
  UPCAST whole, or left."""
  out, glob = [], [a for a in k0.upcastable_dims if k0.axis_types[a] in (AxisType.GLOBAL, AxisType.LOOP, AxisType.WEAK) and isinstance(k0.full_shape[a], int)]
  keys = max(glob, key=lambda a: k0.full_shape[a])
  small = [a for a in glob if a != keys and k0.full_shape[a] <= 8]
  for r, g, l, u, how in itertools.product((1, 2, 4), (0, 4, 8, 16, 32), (1, 4, 16), (1, 4), itertools.product(("", "L", "U"), repeat=len(small))):
    k = k0.copy()
    try:
      if r > 1: k.apply_opt(Opt(OptOps.UNROLL, 0, r))
      if g: k.apply_opt(Opt(OptOps.GROUP, 0, g))
      for a, h in zip(small, how):
        if h: k.apply_opt(Opt(OptOps.LOCAL if h == "L" else OptOps.UPCAST, a, 0))
      if u > 1: k.apply_opt(Opt(OptOps.UPCAST, keys, u))
      if l > 1: k.apply_opt(Opt(OptOps.LOCAL, keys, l))
      red = [i for i, d in enumerate(k.unrollable_dims) if k.axis_types[d] is AxisType.REDUCE]
      if red and k.full_shape[k.unrollable_dims[red[-1]]] <= 8: k.apply_opt(Opt(OptOps.UNROLL, red[-1], 0))
    except KernelOptError: continue
    out.append(k)
  return out

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("model"); ap.add_argument("--pos", type=int, default=4096); ap.add_argument("--context", type=int, default=4352)
  ap.add_argument("--kernel", type=int, default=0); ap.add_argument("--cnt", type=int, default=10)
  ap.add_argument("--top", type=int, default=15); ap.add_argument("--json")
  a = ap.parse_args()
  from orin_llm.engine import Engine
  eng = Engine(a.model, max_context=a.context, max_batch=1)
  ren = Device[Device.DEFAULT].renderer
  kernels = [pre_opts(c.src[0], ren) for c in step_kernels(eng, "decode", 1, a.pos)]
  ast, name = [k for k in kernels if "start_pos" in k[1]][a.kernel]  # the kernels over the key blocks (their count in the name)
  k0 = Scheduler(ast, ren); k0.convert_loop_to_global()
  print(f"{name}: shape {[d if isinstance(d, int) else 'nb' for d in k0.full_shape]} {[t.name for t in k0.axis_types]}")
  rawbufs, var_vals = args_from_ast(ast, ren.target.device)
  var_vals = {k: (a.pos if k == "start_pos" else v) for k, v in var_vals.items()}
  rawbufs = _ensure_buffer_alloc(rawbufs)
  for b in rawbufs:  # fresh random halves (finite, |x| < 2): never time on zeros
    src = np.random.default_rng().integers(0, 2**16, size=b.nbytes // 2, dtype=np.uint16) & np.uint16(0x3bff)
    b.copy_from(Buffer("PYTHON", b.size, b.dtype, opaque=memoryview(bytearray(src.tobytes()))))
  cands, b_at = [hand_coded_optimizations(k0.copy())], None
  try:  # the database's result: BEAM's cache, as the server's step gets it (nothing searched: BEAM_MIN_US)
    from tinygrad.codegen.opt.search import beam_search
    from tinygrad.helpers import Context
    with Context(BEAM=2, IGNORE_BEAM_CACHE=0): kb = beam_search(k0.copy(), rawbufs, var_vals, 2)
    if kb.applied_opts != cands[0].applied_opts: cands, b_at = cands + [kb], 1
  except Exception as e: print(f"(no database result: {e})")
  cands += grid(k0)
  st, results = time.perf_counter(), []
  for i, proc in imap_unordered_watched(_try_compile, list(enumerate(cands)), 60.0):
    if proc is None: continue
    try: tms = _time_program(proc[0], var_vals, rawbufs, allow_test_size=False, clear_l2=True, cnt=a.cnt)
    except RuntimeError: continue  # a launch the device refuses, as BEAM skips it
    results.append({"kernel": name, "pos": a.pos, "which": "H" if i == 0 else "B" if i == b_at else "",
                    "opts": [f"{o.op.name}:{o.axis}:{o.arg}" for o in cands[i].applied_opts],
                    "min_us": round(min(tms) * 1e6, 2), "median_us": round(statistics.median(tms) * 1e6, 2)})
  results.sort(key=lambda r: r["median_us"])
  print(f"{len(results)} of {len(cands)} candidates timed in {time.perf_counter() - st:.1f} s (H: hand-coded, B: the database's)")
  marked = [r for r in results if r["which"]]
  for r in results[:a.top] + [m for m in marked if m not in results[:a.top]]:
    print(f"  {r['which'] or ' '} {r['median_us']:9.2f} us (min {r['min_us']:9.2f})  {' '.join(r['opts'])}")
  if a.json: json.dump(results, open(a.json, "w"), indent=1)

if __name__ == "__main__": main()
