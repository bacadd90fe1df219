"""0031-heads-dot-products-lanes-on-head-dim: a head's dot products against a block of cached keys (decode attention's
scores: every query head of a group against every key of a block, the reduce a head's dimension under 256) get the
lanes on the head's dimension: its pairs unrolled by 2, a GROUP of 16 lanes, 4 keys a thread and 16 a block, the pair
unrolled whole. Before, the rules left each thread one key's whole head dimension, a warp's lanes on keys a row apart:
the 8B's scores read their keys at ~190 GB/s at depth 4096 (H200, docs/PERF.md twenty-fourth session).

The opts come from a CUDA renderer constructed without a GPU (sm_87), for the form of orin_llm's decode scores (the
block count symbolic, float16 keys, float32 queries); MV_HEADS=0 keeps the old rules' opts. The numerics run on
tinygrad's CUDA-flavoured emulator (DEV=PYTHON) against numpy in float64 on fresh random inputs. 0001-0030: no GROUP
in the scores' opts (the first test fails)."""
import json, os, subprocess, sys, textwrap
import pytest

SCORES = textwrap.dedent('''
  import json, os, sys
  import numpy as np
  from tinygrad import Tensor, UOp, dtypes
  KV, G, KEYS, D, NB, render = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "render"
  seed = int(sys.argv[7])
  rng = np.random.default_rng(seed)
  dev = "CPU" if render else None
  kc = rng.standard_normal((NB * KEYS, KV, D)).astype(np.float16)
  qn = rng.standard_normal((KV, G, D)).astype(np.float32)
  cache, q = Tensor(kc, device=dev).contiguous().realize(), Tensor(qn, device=dev).realize()
  nb = UOp.variable("start_pos", 0, NB * KEYS - 1) // KEYS + 1 if render else NB
  # (nb, KV, G, KEYS): each query head of a group against each key of a block, over the head's dimension
  keys = cache.reshape(-1, KEYS, KV, D)[0:nb].permute(0, 2, 1, 3).float()
  s = (q.reshape(1, KV, G, 1, D) * keys.reshape(nb, KV, 1, KEYS, D)).sum(-1)
  if render:
    from tinygrad.codegen import full_rewrite_to_sink
    from tinygrad.helpers import Target
    from tinygrad.renderer.cstyle import CUDARenderer
    from tinygrad.uop.ops import Ops
    ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
    for call in s.contiguous().linear_with_vars()[0].src:
      if call.src[0].op is Ops.SINK:
        sink = full_rewrite_to_sink(call.src[0], ren)
        print(json.dumps({"opts": [[o.op.name, o.axis, o.arg] for o in sink.arg.applied_opts]}))
  else:
    want = np.einsum("hgd,nkhd->nhgk", qn.astype(np.float64), kc.astype(np.float64).reshape(NB, KEYS, KV, D))
    got = s.numpy()
    print(json.dumps({"err": float(np.abs(got - want).max() / np.abs(want).max())}))
''')

def run(args, env):
  r = subprocess.run([sys.executable, "-c", SCORES, *map(str, args), str(int.from_bytes(os.urandom(4), "little"))],
                     env=dict({k: v for k, v in os.environ.items() if not k.startswith("MV_")}, **env), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

@pytest.mark.parametrize("kv,g,d", [(8, 4, 128), (8, 4, 64), (2, 8, 64)])  # the 8B's and the 1B's heads, and a wider group
def test_scores_take_lanes_on_the_head_dimension(kv, g, d):
  opts = run((kv, g, 1024, d, 5, "render"), {"MV_HEADS_GRID": "0"})["opts"]  # (0042 swaps the grid's first two after these)
  assert opts[:2] == [["UNROLL", 0, 2], ["GROUP", 0, 16]] and opts[-1][0::2] == ["UNROLL", 0] and len(opts) == 5, opts
  assert [o[0] for o in opts[2:4]] == ["UPCAST", "LOCAL"] and [o[2] for o in opts[2:4]] == [4, 16] and opts[2][1] == opts[3][1], opts
  old = run((kv, g, 1024, d, 5, "render"), {"MV_HEADS": "0"})["opts"]
  assert not any(o[0] == "GROUP" for o in old), old

def test_a_reduce_of_a_weights_row_keeps_the_matvec_rules():
  """A reduce of 256 or more (a weight's row, not a head's dimension) is no head's dot product: the opts are the
  matvec rules' (0022) whatever MV_HEADS says."""
  assert run((1, 4, 1024, 256, 1, "render"), {})["opts"] == run((1, 4, 1024, 256, 1, "render"), {"MV_HEADS": "0"})["opts"]

def test_scores_with_lanes_on_the_head_dimension_compute_the_dot_products():
  err = run((2, 4, 256, 64, 2, "emulate"), {"DEV": "PYTHON"})["err"]
  assert err < 1e-5, err
