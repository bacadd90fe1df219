"""0042-layouts-as-searched: layouts a full BEAM=2 search picked for the 1B Q6_K on an H200, as hand-coded rules
(orin_llm docs/PERF.md, thirty-first and thirty-second sessions). The decode step's four, which made it 7% faster than
the hand-coded opts (with them, decode at BEAM=0 is as fast as after the full search):
- a sum to one value (a norm's sum of squares in a decode step) takes 64 lanes, not 16 (GROUPTOP 16, then GROUP 4);
- decode attention's scores over blocks of cached keys (0031's layout) put the keys' blocks, not the count of blocks, in
  the grid's first place (SWAP);
- a sum of groups' sums (0039) with 4x MV_NESTED_THREADS threads or more gives each thread 4 weight rows (gate+up), and
  one with half as many or fewer unrolls its outer loop's rest by 4 and takes what is left as lanes (ffn_down).
And two of a 512-row prefill chunk's: its tensor-core products (0032's wide layout) with the grid's first two
dimensions swapped, and its norms' sums of squares over 256 rows or more with 16 interleaved lanes a row.
The opts come from a CUDA renderer constructed without a GPU, and are the search's own for the 1B's shapes; the numerics
run on tinygrad's CUDA-flavoured emulator against numpy or gguf in float64 on fresh random inputs. 0001-0041: the six
layout tests fail."""
import json, os, subprocess, sys, textwrap
import pytest
import matvec_kernels
from test_0031_heads_dot_products import run as run_scores

BASE = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | {"ORIN_LLM_AFFINE": "1"}
NESTED = [["LOCAL", 0, 4], ["GROUP", 3, 4], ["GROUP", 2, 8], ["UNROLL", 2, 0], ["UNROLL", 2, 0], ["UNROLL", 2, 2]]

def product_kernel(O, K, env):
  return max(matvec_kernels.kernels(O, K, 1, "Q6_K", env), key=lambda k: len(k["opts"]))

def test_many_rows_take_four_a_thread():
  # the 1B's gate+up: 16384 rows x 32 lanes = 524288 threads -> 131072 (BEAM's pick: UPCAST 0 4 after 0039's layout)
  assert product_kernel(16384, 2048, BASE)["opts"] == NESTED + [["UPCAST", 0, 4]]

def test_few_rows_take_more_lanes():
  # the 1B's ffn_down: 2048 rows x 32 lanes = 65536 threads -> 131072, the loop's rest unrolled (BEAM's pick)
  assert product_kernel(2048, 8192, BASE)["opts"] == NESTED + [["UNROLL", 2, 4], ["GROUP", 0, 0]]

@pytest.mark.parametrize("O,K", [(3072, 2048), (2048, 2048), (4096, 14336)])  # Q/K/V, O (short loop), the 8B's ffn_down
def test_rows_in_between_keep_the_layout(O, K):
  assert product_kernel(O, K, BASE)["opts"] == NESTED

def test_threads_off_switch():
  assert product_kernel(16384, 2048, BASE | {"MV_NESTED_THREADS": "0"})["opts"] == NESTED
  assert product_kernel(2048, 8192, BASE | {"MV_NESTED_THREADS": "0"})["opts"] == NESTED

@pytest.mark.parametrize("env,K", [({"MV_NESTED_THREADS": "64"}, 2048), ({}, 8192)])  # 16 rows: 4 a thread / more lanes
def test_products_match_gguf(env, K):
  err, laid_out = matvec_kernels.product_error("Q6_K", K, 1, BASE | env, marker="MATVEC NESTED:")
  assert laid_out and err < 1e-5, err

def test_scores_put_the_keys_blocks_first_in_the_grid():
  opts = run_scores((8, 4, 1024, 64, 5, "render"), {})["opts"]
  assert opts == [["UNROLL", 0, 2], ["GROUP", 0, 16], ["UPCAST", 3, 4], ["LOCAL", 3, 16], ["UNROLL", 1, 0], ["SWAP", 0, 3]], opts
  assert run_scores((8, 4, 1024, 64, 5, "render"), {"MV_HEADS_GRID": "0"})["opts"] == opts[:-1]

def test_scores_with_the_keys_blocks_first_compute_the_dot_products():
  err = run_scores((2, 4, 256, 64, 2, "emulate"), {"DEV": "PYTHON"})["err"]
  assert err < 1e-5, err

SUM = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor
  N, render = int(sys.argv[1]), sys.argv[2] == "render"
  x = np.random.default_rng(int(sys.argv[3])).standard_normal(N).astype(np.float32)
  s = (Tensor(x, device="CPU" if render else None) ** 2).sum()
  if render:
    from tinygrad.codegen import full_rewrite_to_sink
    from tinygrad.helpers import Target
    from tinygrad.renderer.cstyle import CUDARenderer
    from tinygrad.uop.ops import Ops
    ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
    for call in s.contiguous().linear_with_vars()[0].src:
      if call.src[0].op is Ops.SINK: print(json.dumps([[o.op.name, o.axis, o.arg] for o in full_rewrite_to_sink(call.src[0], ren).arg.applied_opts]))
  else:
    want = float((x.astype(np.float64) ** 2).sum())
    print(json.dumps(abs(float(s.item()) - want) / want))
''')

def run_sum(args, env):
  r = subprocess.run([sys.executable, "-c", SUM, *map(str, args), str(int.from_bytes(os.urandom(4), "little"))],
                     env={k: v for k, v in os.environ.items() if k not in ("GROUP_ONE",)} | env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_a_sum_to_one_value_takes_64_lanes():
  assert run_sum((2048, "render"), {}) == [["GROUPTOP", 0, 16], ["GROUP", 0, 4]]
  assert run_sum((2048, "render"), {"GROUP_ONE": "0"}) == [["GROUPTOP", 0, 16]]

def test_a_sum_with_64_lanes_is_the_sum():
  assert run_sum((2048, "emulate"), {"DEV": "PYTHON"}) < 1e-6

# The prefill chunk's two: its tensor-core products (0032's wide layout) with the grid's two first dimensions swapped, and
# its norms' sums of squares over 512 rows with 16 interleaved lanes a row (the matvec rules took them before).
from test_0032_tc_wide_products import opts as tc_opts, HAND, WIDE

@pytest.mark.parametrize("M,N,K", [(512, 3072, 2048), (512, 16384, 2048)])  # the 1B's Q/K/V and gate+up
def test_chunk_products_swap_the_grid(M, N, K):
  got = tc_opts(M, N, K, {})
  assert got[0][0] == "TC" and got[1:] == HAND + WIDE + [["SWAP", 0, 1]], got
  assert tc_opts(M, N, K, {"TC_WIDE_GRID": "0"})[1:] == HAND + WIDE

ROWS = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor
  R, N, render = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "render"
  x = np.random.default_rng(int(sys.argv[4])).standard_normal((R, N)).astype(np.float32)
  t = Tensor(x, device="CPU" if render else None)
  s = (t * t).sum(-1)
  if render:
    from tinygrad.codegen import full_rewrite_to_sink
    from tinygrad.helpers import Target
    from tinygrad.renderer.cstyle import CUDARenderer
    from tinygrad.uop.ops import Ops
    ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
    for call in s.contiguous().linear_with_vars()[0].src:
      if call.src[0].op is Ops.SINK: print(json.dumps([[o.op.name, o.axis, o.arg] for o in full_rewrite_to_sink(call.src[0], ren).arg.applied_opts]))
  else:
    want = (x.astype(np.float64) ** 2).sum(-1)
    print(json.dumps(float(np.abs(s.numpy() - want).max() / np.abs(want).max())))
''')

def run_rows(args, env):
  r = subprocess.run([sys.executable, "-c", ROWS, *map(str, args), str(int.from_bytes(os.urandom(4), "little"))],
                     env={k: v for k, v in os.environ.items() if k not in ("ROW_SQUARES",) and not k.startswith("MV_")} | env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_row_squares_take_16_lanes_a_row():
  assert run_rows((512, 2048, "render"), {}) == [["GROUP", 0, 16]]
  assert run_rows((512, 2048, "render"), {"ROW_SQUARES": "0"}) != [["GROUP", 0, 16]]
  assert run_rows((32, 2048, "render"), {}) == run_rows((32, 2048, "render"), {"ROW_SQUARES": "0"})  # a short chunk's: unchanged

def test_row_squares_with_16_lanes_are_the_sums():
  assert run_rows((256, 512, "emulate"), {"DEV": "PYTHON"}) < 1e-6
