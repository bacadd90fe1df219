"""0034-tc-split-products-wide: a tensor-core product that orin_llm runs in parts (quant.split_parts: `(S, T, L) @ (S, L, N)`,
a leading axis, the hand-coded TC, UPCAST(1,4), UPCAST(2,4), LOCAL(2,4) one axis later than an unsplit product's) gets
LOCAL(2,4), UPCAST(5,2) and SWAP(1,2): four warps more on N, one more upcast, the grid's fastest dimension on the rows'
blocks. BEAM's pick for the 1B's 512-row ffn_down (4 parts of 2048) on an H200; as the hand-coded opts, at BEAM=0 pp512
and pp2048 +7.7% (docs/PERF.md, twenty-fifth session). TC_SPLIT_WIDE=0 keeps the hand-coded opts.

The opts come from a CUDA renderer constructed without a GPU (sm_87), for float16 products with float32 sums as orin_llm's
prefill chunks run them. 0001-0033: the hand-coded opts only (the first test fails)."""
import json, os, subprocess, sys, textwrap
import pytest

RENDER = textwrap.dedent('''
  import json, sys
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  S, M, N, K = map(int, sys.argv[1:5])
  x, w = Tensor.empty(S, M, K, dtype=dtypes.float16, device="CPU"), Tensor.empty(S, K, N, dtype=dtypes.float16, device="CPU")
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  for call in x.matmul(w, dtype=dtypes.float32).linear_with_vars()[0].src:
    if call.src[0].op is Ops.SINK:
      print(json.dumps([[o.op.name, o.axis, o.arg if not isinstance(o.arg, tuple) else list(o.arg)] for o in full_rewrite_to_sink(call.src[0], ren).arg.applied_opts]))
''')

def opts(S, M, N, K, env):
  r = subprocess.run([sys.executable, "-c", RENDER, str(S), str(M), str(N), str(K)], capture_output=True, text=True, timeout=300,
                     env=dict({k: v for k, v in os.environ.items() if not k.startswith(("MV_", "TC_"))}, **env))
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

HAND = [["UPCAST", 1, 4], ["UPCAST", 2, 4], ["LOCAL", 2, 4]]

@pytest.mark.parametrize("S,M,N,K", [(4, 512, 2048, 2048), (4, 512, 4096, 3584), (2, 512, 16384, 2048)])  # the 1B's ffn_down, an 8B-like part
def test_split_products_take_the_wide_layout(S, M, N, K):
  got = opts(S, M, N, K, {})
  assert got[0][0] == "TC" and got[1:] == HAND + [["LOCAL", 2, 4], ["UPCAST", 5, 2], ["SWAP", 1, 2]], got
  off = opts(S, M, N, K, {"TC_SPLIT_WIDE": "0"})
  assert off[0][0] == "TC" and off[1:] == HAND, off

def test_unsplit_products_are_left_to_0032():
  assert opts(1, 512, 2048, 2048, {}) == opts(1, 512, 2048, 2048, {"TC_SPLIT_WIDE": "0"})
