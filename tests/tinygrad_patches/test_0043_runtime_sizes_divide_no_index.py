"""0043-runtime-sizes-divide-no-index: a size known only at runtime (orin_llm's count of key blocks, which follows the
position) enters a kernel's addresses only where it must.
- Launch dims: with each dim its own launch dim (none grouped or split), a dim's index is its launch index. Through one
  flat index, every dim after one of runtime size was recovered by a division and a modulo by that size, which the
  simplifier cannot undo (the prefill chunk's exp of the scores: three a thread).
- Reshapes: a reshape with a runtime size runs on each run of axes that map onto each other (cut where both shapes'
  leading products are equal), the run's first axis with no modulo. Through one flat index, the chunk's product of
  probabilities and values (its keys' blocks and the keys of a block one axis) did 15 divisions and modulos by runtime
  values in its inner loop.
With both, a 1B Q6_K's pp2048 at BEAM=0 went 48.2-48.5k -> 49.6-49.7k tok/s on an H200 (orin_llm docs/PERF.md,
thirty-third session). The kernels are lowered for CUDA by a renderer constructed without a GPU (no integer division or
modulo by a non-constant may remain), and run on tinygrad's CPU backend against numpy in float64 on fresh random inputs,
the runtime size bound to a value below its bound.
0001-0042: each of the two kernels divides by the runtime size (its test fails)."""
import json, os, subprocess, sys, textwrap
import numpy as np
import pytest

PROBE = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor, UOp, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  case, seed, k, NB = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 6
  rng = np.random.default_rng(seed)
  def build(n):
    if case == "grid":  # exp of (n, 512, 64) scores minus each row's max, written into a buffer sized for the bound
      xs, ms = rng.standard_normal((NB, 512, 64)).astype(np.float32), rng.standard_normal((512, 1)).astype(np.float32)
      dst = Tensor.zeros(NB, 512, 64, dtype=dtypes.float16, device="CPU").contiguous().realize()
      out = dst[0:n].assign((Tensor(xs, device="CPU")[0:n] - Tensor(ms, device="CPU")).exp().cast(dtypes.float16))
      return out, dst, lambda k: np.exp(xs[:k].astype(np.float64) - ms)
    # blocks of 16 keys (n, 4 parts, 16, 8 heads): each part's keys one axis (n*16), summed against the values
    ps, vs = rng.standard_normal((NB, 4, 16, 8)).astype(np.float32), rng.standard_normal((NB, 4, 16, 8, 32)).astype(np.float32)
    p = Tensor(ps, device="CPU")[0:n].permute(1, 3, 0, 2).reshape(4, 8, n * 16)
    v = Tensor(vs, device="CPU")[0:n].permute(1, 3, 0, 2, 4).reshape(4, 8, n * 16, 32)
    return (p.unsqueeze(-1) * v).sum(2).contiguous(), None, \\
      lambda k: np.einsum("nsrh,nsrhd->shd", ps[:k].astype(np.float64), vs[:k].astype(np.float64))
  n = UOp.variable("n", 1, NB)
  out, _, _ = build(n)
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  divs = []
  for call in out.linear_with_vars()[0].src:
    if call.src[0].op is Ops.SINK:
      sink = full_rewrite_to_sink(call.src[0], ren)
      # a division or modulo whose divisor is not a constant (the runtime size, or anything computed from it)
      divs += [str(u.src[1].op) for u in sink.toposort()
               if u.op in (Ops.CDIV, Ops.CMOD, Ops.FLOORDIV, Ops.FLOORMOD) and u.src[1].op is not Ops.CONST]
  out, dst, ref = build(n.bind(k))
  got = out.numpy() if dst is None else (out.realize(), dst.numpy()[:k])[1]
  r = ref(k)
  print(json.dumps({"divs": divs, "err": float(np.abs(got.astype(np.float64) - r).max() / np.abs(r).max())}))
''')

def probe(case, k):
  seed = int(np.random.SeedSequence().entropy % 2**31)
  r = subprocess.run([sys.executable, "-c", PROBE, case, str(seed), str(k)], capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, DEV="CPU"))
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1]), seed

@pytest.mark.parametrize("k", [2, 5])
def test_launch_dims_after_a_runtime_size_divide_nothing(k):
  got, seed = probe("grid", k)
  assert got["divs"] == [], (got["divs"], seed)
  assert got["err"] < 2e-3, (got["err"], seed)  # float16 outputs

@pytest.mark.parametrize("k", [3, 6])
def test_reshape_of_runs_with_a_runtime_size_divides_nothing(k):
  got, seed = probe("runs", k)
  assert got["divs"] == [], (got["divs"], seed)
  assert got["err"] < 1e-5, (got["err"], seed)
