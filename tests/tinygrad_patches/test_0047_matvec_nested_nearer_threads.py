"""0047-matvec-nested-nearer-threads: 0042 gives each thread of a sum of groups' sums (0039) 4 weight rows from 4x
MV_NESTED_THREADS threads; 0047 from over 2x, where the quarter lies nearer the target than the whole, in ratio. The
8B's gate+up in Q4_K (28672 rows of 4096, two rows a thread's step: 458752 threads, 3.5x) kept 2 rows a thread, and the
8B Q4_K_M's decode on an H200 ran 2.2% faster with 4 (orin_llm docs/PERF.md, forty-third session); rendered for every
seed model's decode step, no other kernel changes (the 1B's and 3B's Q4_K gate+up have exactly 2x and keep theirs).
Opts from a CUDA renderer constructed without a GPU; the numerics on tinygrad's CUDA-flavoured emulator against gguf
in float64 on fresh random inputs. 0001-0046: the first test fails."""
import os
import matvec_kernels
from test_0042_layouts_as_searched import NESTED

BASE = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | {"ORIN_LLM_AFFINE": "1"}

def product_kernel(O, K, qtype, env):
  return max(matvec_kernels.kernels(O, K, 1, qtype, env), key=lambda k: len(k["opts"]))

def test_the_8b_gate_up_takes_four_rows_a_thread():
  got = product_kernel(28672, 4096, "Q4_K", BASE)["opts"]
  assert got[-1] == ["UPCAST", 0, 4], got
  assert product_kernel(28672, 4096, "Q4_K", BASE | {"MV_NESTED_NEAR": "0"})["opts"] == got[:-1]  # 0042's rule: 2

def test_twice_the_threads_keep_their_layout():
  # the 1B's Q4_K gate+up: 16384 rows, two a step: 262144 threads, 2x; a Q6_K product of 8192 rows (one a step): 2x
  assert product_kernel(16384, 2048, "Q4_K", BASE)["opts"][-1] != ["UPCAST", 0, 4]
  assert product_kernel(8192, 2048, "Q6_K", BASE)["opts"] == NESTED

def test_products_match_gguf():
  # 16 rows of Q6_K (one a step): 512 threads, 3.2x a target of 160 (0042 alone: no UPCAST under 640)
  err, laid_out = matvec_kernels.product_error("Q6_K", 2048, 1, BASE | {"MV_NESTED_THREADS": "160"}, marker="MATVEC NESTED:")
  assert laid_out and err < 1e-5, err
