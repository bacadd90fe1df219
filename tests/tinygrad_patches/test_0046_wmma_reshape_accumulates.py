"""0046-wmma-reshape-accumulates: a tensor core's output reached the reduction's accumulator through a reshape (a
reduction with an axis of its own outside the tensor core's 16: orin_llm's few rows' product reduces over (words,
4-bit codes), quant.tc_product), and tinygrad's rule that folds an accumulator's add into the WMMA matched only a
WMMA, a permuted one or a permuted reshape of one. So each WMMA accumulated into zeros and four float adds a WMMA a
thread added its output to the accumulator (16 of the 176 instructions of the 8B's ffn_down's inner loop in Q4_K,
compiled by ptxas for sm_90; orin_llm docs/PERF.md, forty-first session). Rendered for CUDA (sm_87, no GPU) with the
hand-coded opts: with the patch the accumulator is the WMMA's own (stock and 0001-0045: `acc = acc + wmma.x`, the
first test fails). The second test runs the same kind of product on tinygrad's emulator of those tensor cores
(DEV=PYTHON::sm_80, bfloat16 inputs) against numpy in float64 on fresh random codes and inputs."""
import json, os, re, subprocess, sys, textwrap

# the weights as 4-bit codes, 8 to a uint32 word, cast to the tensor core's input type: the reduction is (words, codes)
PRODUCT = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor, dtypes
  O, K, R, seed, dt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), getattr(dtypes, sys.argv[5])
  def product(w, x):
    codes = ((w.unsqueeze(-1) >> (Tensor.arange(8, dtype=dtypes.uint32) * 4)) & 15).cast(dt).reshape(O, K)
    return (codes * x.reshape(R, 1, K)).sum(-1, dtype=dtypes.float32)
''')

RENDER = PRODUCT + textwrap.dedent('''
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
  from tinygrad.helpers import Target, TC_OPT
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite
  TC_OPT.value = 2
  y = product(Tensor.empty(O, K // 8, dtype=dtypes.uint32, device="CPU"), Tensor.empty(R, K, dtype=dt, device="CPU"))
  [call] = [c for c in y.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  pm = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                       (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])
  sink = full_rewrite_to_sink(call.src[0], ren)
  src = graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), pm, ctx=ren).src[-1].arg
  print(json.dumps({"opts": [o.op.name for o in sink.arg.applied_opts], "src": src}))
''')

EMULATE = PRODUCT + textwrap.dedent('''
  from tinygrad.helpers import TC_OPT
  import tinygrad.codegen.opt.heuristic as H
  TC_OPT.value = 2
  plain, opts = H.hand_coded_optimizations, []
  def recorded(k):
    k = plain(k)
    if k.reduceops: opts.extend(o.op.name for o in k.applied_opts)
    return k
  H.hand_coded_optimizations = recorded
  rng = np.random.default_rng(seed)
  w = rng.integers(0, 2**32, size=(O, K // 8), dtype=np.uint64).astype(np.uint32)
  x = Tensor(rng.standard_normal((R, K)).astype(np.float32)).cast(dt).realize()
  got = product(Tensor(w), x).numpy()
  codes = ((w[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15).reshape(O, K).astype(np.float64)
  want = x.cast(dtypes.float32).numpy().astype(np.float64) @ codes.T
  print(json.dumps({"err": float(np.abs(got - want).max() / np.abs(want).max()), "opts": opts}))
''')

def run(script: str, *args, dev: str) -> dict:
  env = dict(os.environ, DEV=dev)
  r = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_the_accumulator_is_the_wmma_own():
  out = run(RENDER, 256, 2048, 8, 0, "float16", dev="CPU")
  src = out["src"]
  assert out["opts"][0] == "TC" and re.search(r"= __WMMA_8_16_16_half_float\(", src), out["opts"]
  assert not re.search(r"\+wmma\d+\.[xyzw]\)", src), src  # no float add of a WMMA's output to an accumulator
  # each WMMA's third operand is the accumulator, not a constant of zeros
  zeros = set(re.findall(r"float4 (cast\d+) = make_float4\(0\.0f,0\.0f,0\.0f,0\.0f\);", src))
  calls = [l for l in src.split("\n") if "= __WMMA_8_16_16_half_float(" in l]
  thirds = [re.search(r", cast\d+, (.*)\);$", l).group(1) for l in calls]
  assert thirds and not any(c in zeros for c in thirds) and all("buf" in c for c in thirds), thirds

def test_products_on_the_emulated_tensor_cores_match_float64(rng):
  out = run(EMULATE, 32, 256 * int(rng.integers(1, 3)), 8, int(rng.integers(0, 2**31)), "bfloat16", dev="PYTHON::sm_80")
  assert "TC" in out["opts"] and out["err"] < 1e-5, out
