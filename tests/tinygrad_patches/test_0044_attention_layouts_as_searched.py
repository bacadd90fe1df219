"""0044-attention-layouts-as-searched: the layouts BEAM added to the hand-coded ones for a prefill chunk's attention in the
1B (512 rows, 32 query heads in 8 groups of 4, head dim 64, keys in blocks of 256 whose count follows the position),
as rules, each behind a switch:
- the scores on tensor cores (a global axis of runtime size, a constant reduce): the reduce's rest unrolled whole and the
  key-value heads' axis swapped with the rows' blocks (UNROLL 0 0, SWAP 1 3; TC_ATTN_SCORES);
- their exp (elementwise, the block count first, 2M elements a block or more): 16 float4s a thread (UPCAST 1 4,
  UPCAST 3 4, LOCAL 1 4; ATTN_EXP); a 32-row chunk's (1024 rows) keeps its layout;
- the product of probabilities and values (72 columns: 64 and the denominator's ones; a reduce of runtime size): the
  columns' rest upcast whole, two row blocks a thread block, the heads' axis swapped with the parts' (UPCAST 3 0, LOCAL
  0 2, SWAP 1 2; TC_ATTN_VALUES).
With 0042 and 0043 at BEAM=0 on an H200, the three took pp2048 from 49.6k to 51.5-52.1k tok/s, within 1.6% of a BEAM=2
search of the same build in the same call (orin_llm docs/PERF.md, thirty-third session). The kernels are built as
orin_llm's model.Block.attend_chunk builds them and their opts come from a CUDA renderer constructed without a GPU
(sm_87). 0001-0043: the layout test fails (the three kernels keep the hand-coded layouts)."""
import json, os, subprocess, sys, textwrap
import pytest

RENDER = textwrap.dedent('''
  import json, sys
  from tinygrad import Tensor, UOp, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  T, KV, g, D, BLOCK, S = int(sys.argv[1]), 8, 4, 64, 256, 4
  nb = (UOp.variable("start_pos", 0, 4352) + 255) // 256 + 2  # the chunk's key blocks, as the engine counts them
  cache = Tensor.empty(20 * BLOCK, 1, 2, KV, D, dtype=dtypes.float16, device="CPU")  # (rows, slots, K/V, heads, dims)
  kv = cache.reshape(-1, BLOCK, 1, 2, KV, D)[0:nb]
  q16 = Tensor.empty(1, 1, KV, g, T, 1, D, dtype=dtypes.float16, device="CPU")
  keys = kv[:, :, :, 0].permute(0, 2, 3, 1, 4).reshape(nb, 1, KV, 1, 1, BLOCK, D)
  scores = (q16 * keys).sum(-1, dtype=dtypes.float32)  # (nb, 1, KV, g, T, BLOCK)
  # masked to the keys at or before each query's position (model.softmax_numerator: positions from a table)
  pos, qpos = Tensor.empty(20 * BLOCK, dtype=dtypes.int32, device="CPU"), Tensor.empty(T, dtype=dtypes.int32, device="CPU")
  kpos = pos.reshape(-1, BLOCK)[0:nb].reshape(nb, 1, 1, 1, 1, BLOCK)
  scores = (kpos <= qpos.reshape(1, 1, 1, 1, T, 1)).where(scores * 0.125, float("-inf"))
  e = (scores - scores.max((0, -1), keepdim=True)).exp()
  R = BLOCK // S
  p16 = e.cast(dtypes.float16).contiguous().reshape(nb, 1, KV, g, T, S, R).permute(5, 1, 2, 3, 4, 0, 6).reshape(S, 1, KV, g * T, nb * R)
  vals = kv[:, :, :, 1].reshape(nb, S, R, 1, KV, D).permute(1, 3, 4, 0, 2, 5).reshape(S, 1, KV, nb * R, D).pad(((0, 0),) * 4 + ((0, 8),), value=1.0)
  out = p16.matmul(vals, dtype=dtypes.float32)
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  got = {}
  for call in out.contiguous().linear_with_vars()[0].src:
    if call.src[0].op is Ops.SINK:
      sink = full_rewrite_to_sink(call.src[0], ren)
      got[str(len(got))] = {"name": sink.arg.name, "out": str(call.src[1].dtype), "n": len(call.src) - 1,
                            "opts": [[o.op.name, o.axis, list(o.arg) if isinstance(o.arg, tuple) else o.arg] for o in sink.arg.applied_opts]}
  print(json.dumps(list(got.values())))
''')

def kernels(rows, env=None):
  r = subprocess.run([sys.executable, "-c", RENDER, str(rows)], capture_output=True, text=True, timeout=600,
                     env={k: v for k, v in os.environ.items() if not k.startswith(("MV_", "TC_", "ATTN_"))} | (env or {}))
  assert r.returncode == 0, r.stderr[-3000:]
  ks = json.loads(r.stdout.strip().splitlines()[-1])
  tc = [k for k in ks if k["opts"] and k["opts"][0][0] == "TC"]
  assert len(tc) == 2, [k["opts"] for k in ks]  # the scores, then the product with V
  [exp] = [k for k in ks if k["name"].startswith("E") and k["out"] == "dtypes.half"]
  return tc[0]["opts"], exp["opts"], tc[1]["opts"]

TC = ["TC", 0, [-1, 0, 1]]
SCORES = [TC, ["UPCAST", 3, 4], ["UPCAST", 4, 4], ["LOCAL", 4, 4]]
EXP = [["UPCAST", 2, 4], ["LOCAL", 1, 8], ["LOCAL", 2, 16]]
VALUES = [TC, ["UPCAST", 2, 4], ["UPCAST", 3, 3], ["SWAP", 0, 2]]  # 0036's swap last

def test_chunk_attention_takes_the_searched_layouts():
  scores, exp, values = kernels(512)
  assert scores == SCORES + [["UNROLL", 0, 0], ["SWAP", 1, 3]], scores
  assert exp == EXP + [["UPCAST", 1, 4], ["UPCAST", 3, 4], ["LOCAL", 1, 4]], exp
  assert values == VALUES + [["UPCAST", 3, 0], ["LOCAL", 0, 2], ["SWAP", 1, 2]], values

@pytest.mark.parametrize("switch,which", [("TC_ATTN_SCORES", 0), ("ATTN_EXP", 1), ("TC_ATTN_VALUES", 2)])
def test_each_switch_turns_its_rule_off(switch, which):
  on, off = kernels(512), kernels(512, {switch: "0"})
  assert off[which] == (SCORES, EXP, VALUES)[which], off[which]
  assert [x for i, x in enumerate(off) if i != which] == [x for i, x in enumerate(on) if i != which]

def test_a_short_chunks_exp_keeps_its_layout():
  assert kernels(32)[1] == kernels(32, {"ATTN_EXP": "0"})[1]
