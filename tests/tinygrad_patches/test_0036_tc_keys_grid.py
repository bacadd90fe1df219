"""0036-tc-keys-grid: the attention's product of probabilities and values on tensor cores (a reduce over the cached keys,
whose count follows the position) swaps the rows' blocks with the global axis two before them (the keys' parts in a
prefill chunk, the slots in the group step). BEAM made this swap in each of the 1B's such products on an H200 (512-row
chunk, 32-row chunk, group step); as the hand-coded opts, at BEAM=0 pp2048 +2.1%, pp512 unchanged (docs/PERF.md,
twenty-fifth session). TC_KEYS_GRID=0 keeps the hand-coded opts.

The opts come from a CUDA renderer constructed without a GPU (sm_87), for the form of orin_llm's chunk attention
(model.attend_chunk): float16 probabilities (parts, slots, key-value heads, rows, keys) times float16 values with columns
of ones (72), float32 sums, the key count symbolic. A product over a constant reduce (a weight's) is left as it was.
0001-0035: no SWAP (the first test fails)."""
import json, os, subprocess, sys, textwrap
import pytest

RENDER = textwrap.dedent('''
  import json, sys
  from tinygrad import Tensor, UOp, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  S, B, KV, R, D, NB, symbolic = map(int, sys.argv[1:8])
  # laid out as the engine lays them out (model.attend_chunk): the probabilities written (blocks, slots, heads, rows, parts,
  # keys of a part), the values read from the cache (rows, slots, K/V, heads, dims), its 8 columns of ones padded on
  # (built as plain (S, B, KV, ...) tensors, 0043's reshapes let the parts, slots and heads merge into one axis)
  BLOCK, RK = 256, 256 // S
  n = UOp.variable("start_pos", 0, (NB - 1) * 256) // 256 + 1 if symbolic else NB
  p = Tensor.empty(NB, B, KV, R, S, RK, dtype=dtypes.float16, device="CPU")[0:n].permute(4, 1, 2, 3, 0, 5).reshape(S, B, KV, R, n * RK)
  cache = Tensor.empty(NB * BLOCK, B, 2, KV, D - 8, dtype=dtypes.float16, device="CPU").reshape(-1, BLOCK, B, 2, KV, D - 8)[0:n]
  v = cache[:, :, :, 1].reshape(n, S, RK, B, KV, D - 8).permute(1, 3, 4, 0, 2, 5).reshape(S, B, KV, n * RK, D - 8)
  v = v.pad(((0, 0),) * 4 + ((0, 8),), value=1.0)
  out = p.matmul(v, dtype=dtypes.float32)  # (S, B, KV, R, D): each part's keys, RK of each block
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  for call in out.contiguous().linear_with_vars()[0].src:
    if call.src[0].op is Ops.SINK:
      print(json.dumps([[o.op.name, o.axis, o.arg if not isinstance(o.arg, tuple) else list(o.arg)] for o in full_rewrite_to_sink(call.src[0], ren).arg.applied_opts]))
''')

def opts(*args, env=None):
  r = subprocess.run([sys.executable, "-c", RENDER, *map(str, args)], capture_output=True, text=True, timeout=300,
                     env={**{k: v for k, v in os.environ.items() if not k.startswith(("MV_", "TC_"))}, "TC_ATTN_VALUES": "0",
                          **(env or {})})  # 0044's layout adds opts after 0036's swap
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

@pytest.mark.parametrize("S,B,KV,R,D,swap", [(4, 1, 8, 2048, 72, [0, 2]), (4, 4, 8, 128, 72, [1, 3]), (4, 1, 8, 2048, 136, [0, 2])])
def test_values_product_over_keys_swaps_the_rows(S, B, KV, R, D, swap):
  """The 1B's 512-row chunk (4 query heads a group: 2048 rows), its group step (4 slots of 32 rows), the 8B's chunk."""
  got = opts(S, B, KV, R, D, 4, 1)
  assert got[0][0] == "TC" and got[-1] == ["SWAP", *swap], got
  off = opts(S, B, KV, R, D, 4, 1, env={"TC_KEYS_GRID": "0"})
  assert off == got[:-1], (got, off)

def test_a_constant_reduce_is_left_as_it_was():
  assert opts(4, 1, 8, 2048, 72, 4, 0) == opts(4, 1, 8, 2048, 72, 4, 0, env={"TC_KEYS_GRID": "0"})
