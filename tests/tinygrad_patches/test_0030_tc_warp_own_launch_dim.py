"""0030-tc-warp-own-launch-dim: a tensor core's WARP axis keeps the first launch dim (threadIdx.x) to itself. A kernel
with more local dims than the launch has (CUDA: 3) gets two of them grouped into one, and tinygrad grouped the WARP
axis (32 lanes) with the next local dim, the lane the slower part: consecutive threads then held lanes of different
tiles, so each hardware warp's mma mixed fragments of several tiles. BEAM chose such opts (the hand-coded ones plus
LOCAL(0,2) LOCAL(1,2) UPCAST(3,2)) for the 1B's prefill products on an H200, which then computed an unrelated result
(relative error 1.4, docs/PERF.md twenty-third session). Stock tinygrad 0.14.0 does the same.

Run on tinygrad's emulator of CUDA's tensor cores (DEV=PYTHON::sm_80; bfloat16 inputs, float32 sums: the same
m16n8k16 tensor core as float16, which the emulator takes only under Python 3.12) against numpy in float64 on fresh
random inputs. 0001-0029: the three cases with four local dims fail; the hand-coded opts pass either way."""
import json, os, subprocess, sys, textwrap
import pytest

EMULATE = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen.opt import Opt, OptOps
  import tinygrad.codegen.opt.heuristic as H
  M, N, K, seed = map(int, sys.argv[1:5])
  OPTS = [Opt(getattr(OptOps, o), a, tuple(x) if isinstance(x, list) else x) for o, a, x in json.loads(sys.argv[5])]
  plain = H.hand_coded_optimizations
  def forced(k):
    if not k.reduceops: return plain(k)
    for o in OPTS: k.apply_opt(o)
    return k
  H.hand_coded_optimizations = forced
  rng = np.random.default_rng(seed)
  a = Tensor(rng.standard_normal((M, K)).astype(np.float32)).cast(dtypes.bfloat16).realize()
  w = Tensor(rng.standard_normal((N, K)).astype(np.float32)).cast(dtypes.bfloat16).realize()
  want = a.cast(dtypes.float32).numpy().astype(np.float64) @ w.cast(dtypes.float32).numpy().astype(np.float64).T
  got = a.matmul(w.T, dtype=dtypes.float32).numpy()
  print(json.dumps({"err": float(np.linalg.norm(got - want) / np.linalg.norm(want))}))
''')

TC = ["TC", 0, [-1, 0, 1]]
HAND = [TC, ["UPCAST", 0, 4], ["UPCAST", 1, 4], ["LOCAL", 1, 4]]  # the hand-coded opts of the prefill's products
BEAM = HAND + [["LOCAL", 0, 2], ["LOCAL", 1, 2], ["UPCAST", 3, 2]]  # BEAM's pick on the H200: WARP + 3 LOCALs
CASES = {
  "hand-coded (WARP + 1 LOCAL)": ((256, 512, 32), HAND),
  "fewest (WARP + 3 LOCALs)": ((64, 32, 16), [TC, ["LOCAL", 0, 2], ["LOCAL", 1, 2], ["LOCAL", 0, 2]]),
  "BEAM's pick": ((256, 512, 32), BEAM),
  "BEAM's pick with SWAP": ((256, 512, 32), BEAM + [["SWAP", 0, 1]]),
}

@pytest.mark.parametrize("case", list(CASES))
def test_tensor_core_product_with_many_local_dims(case):
  (M, N, K), opts = CASES[case]
  seed = int.from_bytes(os.urandom(4), "little")
  r = subprocess.run([sys.executable, "-c", EMULATE, str(M), str(N), str(K), str(seed), json.dumps(opts)],
                     env=dict(os.environ, DEV="PYTHON::sm_80"), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  err = json.loads(r.stdout.strip().splitlines()[-1])["err"]
  assert err < 1e-5, f"{case}: relative error {err:.3g} (seed {seed})"
