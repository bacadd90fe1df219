"""0026-cuda-tc-contiguous-k: the CUDA m16n8k16 tensor cores take K's bits in another order, the same for A and B, so
that a thread's four elements of a row are contiguous in memory. The float16 product a prefill chunk runs (float32
sums), rendered for CUDA (sm_87, no GPU) with the hand-coded opts, then loads both operands in 8-byte vectors; stock
and 0001-0025 load them in 4-byte pairs (the first test fails). The second test runs such products on tinygrad's
emulator of those tensor cores (DEV=PYTHON::sm_80, bfloat16 inputs: the emulator takes no float16 under Python
3.11), with opts that unroll and upcast around the tensor core, against numpy in float64 on fresh random inputs."""
import json, os, subprocess, sys, textwrap
import numpy as np

RENDER = textwrap.dedent('''
  import json, re
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite
  x, w = Tensor.empty(128, 512, dtype=dtypes.float16, device="CPU"), Tensor.empty(256, 512, dtype=dtypes.float16, device="CPU")
  [call] = [c for c in x.matmul(w.T, dtype=dtypes.float32).linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  pm = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                       (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])
  sink = full_rewrite_to_sink(call.src[0], ren)
  src = graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), pm, ctx=ren).src[-1].arg
  loads = re.findall(r"= \\(\\*\\(\\((half\\d*)\\*\\)\\(\\(data([12])", src)
  print(json.dumps({"opts": [o.op.name for o in sink.arg.applied_opts], "loads": loads}))
''')

EMULATE = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen.opt import Opt, OptOps
  import tinygrad.codegen.opt.heuristic as H
  M, K, N, seed = map(int, sys.argv[1:5])
  OPTS = [Opt(OptOps.TC, 0, (-1, 0, 1)), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UNROLL, 0, 2)]
  plain = H.hand_coded_optimizations
  def forced(k):
    if not k.reduceops: return plain(k)
    for o in OPTS: k.apply_opt(o)
    assert any(o.op is OptOps.TC for o in k.applied_opts)
    return k
  H.hand_coded_optimizations = forced
  rng = np.random.default_rng(seed)
  a = Tensor(rng.standard_normal((M, K)).astype(np.float32)).cast(dtypes.bfloat16).realize()
  b = Tensor(rng.standard_normal((N, K)).astype(np.float32)).cast(dtypes.bfloat16).realize()
  fa, fb = a.cast(dtypes.float32).numpy().astype(np.float64), b.cast(dtypes.float32).numpy().astype(np.float64)
  got = a.matmul(b.T, dtype=dtypes.float32).numpy()
  want = fa @ fb.T
  print(json.dumps({"err": float(np.abs(got - want).max() / np.abs(want).max())}))
''')

def run(script: str, *args, dev: str) -> dict:
  env = dict(os.environ, DEV=dev)
  r = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_tensor_core_operands_load_in_8_byte_vectors():
  out = run(RENDER, dev="CPU")
  assert "TC" in out["opts"], out["opts"]
  kinds = {(buf, kind) for kind, buf in out["loads"]}
  assert kinds == {("1", "half4"), ("2", "half4")}, kinds

def test_products_on_the_emulated_tensor_cores_match_float64(rng):
  M, K, N = 64, 32 * int(rng.integers(1, 4)), 64  # K: whole steps of the unroll (2 x 16)
  out = run(EMULATE, M, K, N, int(rng.integers(0, 2**31)), dev="PYTHON::sm_80")
  assert out["err"] < 1e-5, out
