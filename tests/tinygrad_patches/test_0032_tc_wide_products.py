"""0032-tc-wide-products: a tensor-core product whose M and N both take the hand-coded upcast of 4 (a prefill chunk of
512 rows times a model's matrix) gets two warps side by side on each of M and N and one more upcast (LOCAL(0,2),
LOCAL(1,2), UPCAST(3,2) after the hand-coded TC, UPCAST(0,4), UPCAST(1,4), LOCAL(1,4)): BEAM's pick for the 1B's
512-row Q/K/V and gate+up products on an H200. At BEAM=0 the 1B's pp512 went 39.7k -> 44.6k tokens/s, pp2048 34.2k ->
38.1k (docs/PERF.md, twenty-fourth session). TC_WIDE=0 keeps the hand-coded opts. These opts need 0030 (four local
dims with a WARP axis): test_0030 runs them on the tensor-core emulator against numpy.

The opts come from a CUDA renderer constructed without a GPU (sm_87), for float16 products with float32 sums as
orin_llm's prefill chunks run them. 0001-0031: the hand-coded opts only (the first test fails)."""
import json, os, subprocess, sys, textwrap
import pytest

RENDER = textwrap.dedent('''
  import json, sys
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  M, N, K = map(int, sys.argv[1:4])
  x, w = Tensor.empty(M, K, dtype=dtypes.float16, device="CPU"), Tensor.empty(N, K, dtype=dtypes.float16, device="CPU")
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  for call in x.matmul(w.T, dtype=dtypes.float32).linear_with_vars()[0].src:
    if call.src[0].op is Ops.SINK:
      print(json.dumps([[o.op.name, o.axis, o.arg if not isinstance(o.arg, tuple) else list(o.arg)] for o in full_rewrite_to_sink(call.src[0], ren).arg.applied_opts]))
''')

def opts(M, N, K, env):
  r = subprocess.run([sys.executable, "-c", RENDER, str(M), str(N), str(K)], capture_output=True, text=True, timeout=300,
                     env=dict({k: v for k, v in os.environ.items() if not k.startswith(("MV_", "TC_"))}, **env))
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

HAND = [["UPCAST", 0, 4], ["UPCAST", 1, 4], ["LOCAL", 1, 4]]
WIDE = [["LOCAL", 0, 2], ["LOCAL", 1, 2], ["UPCAST", 3, 2]]

@pytest.mark.parametrize("M,N,K", [(512, 3072, 2048), (512, 16384, 2048), (512, 2048, 2048)])  # the 1B's Q/K/V, gate+up, attention output
def test_chunk_products_take_two_warps_a_side(M, N, K):
  got = opts(M, N, K, {"TC_WIDE_GRID": "0"})  # (0042 swaps the grid's first two after these)
  assert got[0][0] == "TC" and got[1:] == HAND + WIDE, got
  off = opts(M, N, K, {"TC_WIDE": "0"})
  assert off[0][0] == "TC" and off[1:] == HAND, off

def test_a_product_without_the_upcasts_keeps_the_hand_coded_opts():
  """32 rows (a short prompt's chunk): M takes an upcast of 2, not 4; nothing is added."""
  assert opts(32, 3072, 2048, {}) == opts(32, 3072, 2048, {"TC_WIDE": "0"})
