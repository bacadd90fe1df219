"""Times one quantized matvec kernel (QuantWeight: O x K, R input rows) under a grid of ~180 opt lists on the GPU,
each compiled by BEAM's worker pool and timed alone 20 times cold (the L2 cleared: patch 0021) and 20 times warm,
on the full grid, beside the hand-coded opts as they are (H) and as they were before patch 0022 (h). What the
heuristic should give a decode matvec, measured instead of guessed (docs/PERF.md, fourteenth session); the table
goes to stdout, every row to --json.
  DEV=CUDA BEAM_MP_CTX=forkserver python3 scripts/mv_opts_bench.py --shape 16384x2048x1:Q6_K --shape 28672x4096x4:Q4_K [--json out.json]"""
import argparse, itertools, json, os, statistics, sys, time
import numpy as np
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor, dtypes, Device
from tinygrad.device import Buffer
from tinygrad.helpers import getenv
from tinygrad.uop.ops import Ops, AxisType
from tinygrad.codegen.opt import Opt, OptOps, KernelOptError
from tinygrad.codegen.opt.postrange import Scheduler, args_from_ast
from tinygrad.codegen.opt.heuristic import hand_coded_optimizations
from tinygrad.codegen.opt.search import _try_compile, _time_program, _ensure_buffer_alloc
from tinygrad.engine.worker import imap_unordered_watched
sys.path.insert(0, ".")
from orin_llm import quant
from step_opts import opt_text, parse_opts  # the opt lists' text, as step_opts.py reads and prints them
from orin_llm.quant import QuantWeight, affine_product

def matvec_ast(O: int, K: int, R: int, qt: QT, ren, form: str = "plain", xin: str = "float"):
  """The product kernel's AST as the heuristic and BEAM see it: after full_rewrite_to_sink's passes before apply_opts
  (ranges split by the planes' indexing: e.g. Q6_K 2048 = 32 x 4 x 2 x 8), captured there. form "affine": the product
  with each group's scale taken out of its sum (quant.affine_product); "tc": the few rows' fused tensor-core form
  (quant.tc_product: its product kernel, not the small one that adds its parts); else QuantWeight's. xin: the input as the step
  has it (float: float32 loaded), in float16 (half), or a constant (const: no input loads at all, the weights' own
  cost: what the product would take if reading x were free)."""
  import tinygrad.codegen as cg
  planes = quant.empty_planes(qt, O, K)
  x = {"float": lambda: Tensor.empty(R, K), "half": lambda: Tensor.empty(R, K, dtype=dtypes.float16).cast(dtypes.float32),
       # a constant broadcast, not Tensor.full: full's buffer is filled by a kernel of its own and loaded like x
       "const": lambda: Tensor(0.5).reshape(1, 1).expand(R, K)}[xin]()
  # (plain: the one sum QuantWeight takes for a few rows, whatever quant.AFFINE does with a single one)
  y = {"affine": lambda: affine_product(x, planes, qt), "tc": lambda: quant.tc_product(x, planes, qt),
       "plain": lambda: (x.unsqueeze(-2) * QuantWeight(qt, O, K, planes).weights()).sum(-1)}[form]()
  sinks = [c.src[0] for c in y.linear_with_vars()[0].src if c.src[0].op is Ops.SINK]
  ast, seen, orig = max(sinks, key=lambda s: len(s.backward_slice)), [], cg.apply_opts  # the product, not a cast or copy around it
  cg.apply_opts = lambda sink, ren, beam=0: (seen.append(sink), orig(sink, ren, beam))[1]
  try: cg.full_rewrite_to_sink(ast, ren)
  finally: cg.apply_opts = orig
  return seen[0]

def grid(k0: Scheduler) -> list[Scheduler]:
  """A GROUP of g lanes on the first reduce axis, the innermost one (a packed word's 8 elements) unrolled whole (and,
  optionally, the one before it too); the rows (the widest global axis) UPCAST by u and LOCAL by l, before or after
  the group; a batch axis (R > 1) upcast whole."""
  out = []
  row = max(k0.upcastable_dims, key=lambda a: k0.full_shape[a])
  batch = [a for a in k0.upcastable_dims if a != row]
  for order, g, un2, u, l in itertools.product(("rows-first", "group-first"), (8, 16, 32, 64), (False, True), (1, 2, 4), (1, 2, 4, 8, 16)):
    if g * l > 1024: continue
    k = k0.copy()
    def rows():
      if u > 1: k.apply_opt(Opt(OptOps.UPCAST, row, u))
      if l > 1: k.apply_opt(Opt(OptOps.LOCAL, row, l))
    try:
      if order == "group-first": k.apply_opt(Opt(OptOps.GROUP, 0, g)); rows()
      else: rows(); k.apply_opt(Opt(OptOps.GROUP, 0, g))
      red = [i for i, d in enumerate(k.unrollable_dims) if k.axis_types[d] is AxisType.REDUCE]
      k.apply_opt(Opt(OptOps.UNROLL, red[-1], 0))
      if un2:
        red = [i for i, d in enumerate(k.unrollable_dims) if k.axis_types[d] is AxisType.REDUCE]
        if not red or k.full_shape[k.unrollable_dims[red[-1]]] > 4: continue
        k.apply_opt(Opt(OptOps.UNROLL, red[-1], 0))
      for b in batch: k.apply_opt(Opt(OptOps.UPCAST, b, 0))
    except KernelOptError: continue
    out.append(k)
  return out

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--shape", action="append", required=True, help="OxKxR:QTYPE, e.g. 16384x2048x1:Q6_K")
  ap.add_argument("--cnt", type=int, default=20)
  ap.add_argument("--top", type=int, default=12)
  ap.add_argument("--json")
  ap.add_argument("--form", choices=("plain", "affine", "tc"), default="plain", help="the product's expression (matvec_ast; "
                  "tc: quant.tc_product, whose tensor-core opt is TC:0:-1/2/1, with TC_OPT=2 for the hand-coded one)")
  ap.add_argument("--tc-part", type=int, help="tc: the parts' length (quant.TC_PART_LEN, "
                  "default 1024), the matrix's size aside (quant.TC_WARPS set to 0; without it, the default rule's parts)")
  ap.add_argument("--x", choices=("float", "half", "const"), default="float", help="the input: float32 as in the step, "
                  "float16, or a constant (no input loads: the weights' own cost)")
  ap.add_argument("--opts", action="append", default=[], help="an opt list to time beside the hand-coded opts, e.g. "
                  "LOCAL:0:4,GROUP:0:32,UNROLL:2:0 (Scheduler.apply_opt's axes); with --no-grid, instead of the grid")
  ap.add_argument("--no-grid", action="store_true")
  a = ap.parse_args()
  if a.tc_part: quant.TC_PART_LEN, quant.TC_WARPS = a.tc_part, 0
  ren, rows_out = Device[Device.DEFAULT].renderer, []
  for spec in a.shape:
    dims, qt = spec.split(":")
    O, K, R = map(int, dims.split("x"))
    ast = matvec_ast(O, K, R, QT[qt], ren, a.form, a.x)
    k0 = Scheduler(ast, ren); k0.convert_loop_to_global()
    rawbufs, var_vals = args_from_ast(ast, ren.target.device)
    rawbufs = _ensure_buffer_alloc(rawbufs)
    for b in rawbufs:  # fresh random words and halves: never time on zeros (a branch or a denormal path could differ)
      src = np.random.default_rng().integers(0, 2**16, size=b.nbytes // 2, dtype=np.uint16) & np.uint16(0x3bff)
      b.copy_from(Buffer("PYTHON", b.size, b.dtype, opaque=memoryview(bytearray(src.tobytes()))))
    # the hand-coded opts as they are, and as they were before 0022 (MV_ROWS_FIRST=0: GROUP 32, LOCAL 4, UPCAST 4)
    cands = [hand_coded_optimizations(k0.copy())]
    os.environ["MV_ROWS_FIRST"], saved = "0", os.environ.get("MV_ROWS_FIRST")
    getenv.cache_clear(); cands.append(hand_coded_optimizations(k0.copy()))
    if saved is None: del os.environ["MV_ROWS_FIRST"]
    else: os.environ["MV_ROWS_FIRST"] = saved
    getenv.cache_clear()
    for ol in a.opts:
      k = k0.copy()
      try:
        for o in parse_opts(ol): k.apply_opt(o)  # a tensor core's tuple argument as TC:0:-1/2/1
      except KernelOptError as e: print(f"{spec}: {ol}: {e}", file=sys.stderr); continue
      cands.append(k)
    if not a.no_grid: cands += grid(k0)
    st, results = time.perf_counter(), []
    for i, proc in imap_unordered_watched(_try_compile, list(enumerate(cands)), 60.0):
      if proc is None: continue
      try:  # cold (the L2 cleared before each run: a decode step streams its weights from memory) and warm (as BEAM timed on CUDA before 0021)
        tms = _time_program(proc[0], var_vals, rawbufs, allow_test_size=False, clear_l2=True, cnt=a.cnt)
        warm = _time_program(proc[0], var_vals, rawbufs, allow_test_size=False, clear_l2=False, cnt=a.cnt)
      except RuntimeError: continue  # a launch the device refuses (too many threads, too much shared memory), as BEAM skips it
      results.append({"shape": spec, "heuristic": {0: "H", 1: "h"}.get(i, ""), "opts": [opt_text(o) for o in cands[i].applied_opts],
                      "min_us": round(min(tms) * 1e6, 2), "median_us": round(statistics.median(tms) * 1e6, 2),
                      "warm_median_us": round(statistics.median(warm) * 1e6, 2)})
    bytes_ = sum(b.nbytes for b in rawbufs)
    results.sort(key=lambda r: r["median_us"])
    hs = [r for r in results if r["heuristic"]]
    print(f"\n{spec} ({a.form}, x {a.x}): {len(results)} of {len(cands)} candidates timed in {time.perf_counter() - st:.1f} s; buffers {bytes_ / 1e6:.1f} MB")
    for r in results[:a.top] + [h for h in hs if h not in results[:a.top]]:
      gbs = bytes_ / (r["median_us"] * 1e-6) / 1e9
      print(f"  {r['heuristic'] or ' '} {r['median_us']:9.2f} us (min {r['min_us']:9.2f}, warm {r['warm_median_us']:9.2f}) {gbs:7.0f} GB/s  "
            f"{' '.join(r['opts'])}")
    rows_out += results
  if a.json: json.dump(rows_out, open(a.json, "w"), indent=1)

if __name__ == "__main__": main()
