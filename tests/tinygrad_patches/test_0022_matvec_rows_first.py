"""0022-matvec-rows-first: on NVIDIA, where none of MV_BLOCKSIZE, MV_THREADS_PER_ROW, MV_ROWS_PER_THREAD is set, the
matvec heuristic lays the weight's rows out before the warp takes the reduce: a single input row 4 weight rows a block
(LOCAL 4, no UPCAST), a few input rows 4 weight rows a thread and 2 a block (UPCAST 4, LOCAL 2), then the GROUP of 32
lanes; a few rows' innermost range (a packed word's 8 elements) unrolled whole. Timed alone with a cold L2 on an H100
(scripts/mv_opts_bench.py; docs/PERF.md, fourteenth session) these were within 1.10x and 1.24x of the best of ~180
layouts for the 1B's and the 8B's matvecs, where 0003's GROUP 32, LOCAL 4, UPCAST 4 was 1.39x and 1.8x off; the 1B
decoded at BEAM=0 at 604.5 tokens/s instead of 476.7, the 8B at 163.5 instead of 148.0. 0001-0021 give 0003's opts.
No GPU needed for the opts (a renderer constructed without a device); the numerics run on tinygrad's CUDA-flavoured
emulator against gguf's own dequantization in float64, on fresh random blocks."""
import os
import pytest
import matvec_kernels

BASE = {k: v for k, v in os.environ.items() if not k.startswith("MV_")}

@pytest.mark.parametrize("qtype,O,K,unroll", [("Q6_K", 2048, 8192, 4), ("Q6_K", 16384, 2048, 3), ("Q6_K", 128256, 2048, 3),
                                              ("Q4_K", 4096, 4096, 2), ("Q4_K", 28672, 4096, 2)])
def test_single_row_four_rows_a_block_before_the_warp(qtype, O, K, unroll):
  [k] = matvec_kernels.kernels(O, K, 1, qtype, BASE)
  assert k["opts"] == [["LOCAL", 0, 4], ["GROUP", 0, 32], ["UNROLL", unroll, 0]], k
  assert k["float4_input"], k

@pytest.mark.parametrize("R", [2, 4, 8])
def test_few_rows_four_weight_rows_a_thread(R):
  # (0038 picks the lanes by the row's length and the thread count; MV_ROWS_THREADS=0: 0022's 32 lanes throughout)
  [k] = matvec_kernels.kernels(2048, 8192, R, "Q6_K", BASE | {"MV_ROWS_THREADS": "0"})
  assert k["opts"] == [["UPCAST", 1, 4], ["LOCAL", 1, 2], ["GROUP", 0, 32], ["UNROLL", 4, 0], ["UPCAST", 0, 0]], k

@pytest.mark.parametrize("env", [{"MV_ROWS_FIRST": "0"}, {"MV_BLOCKSIZE": "4"}, {"MV_THREADS_PER_ROW": "32"}, {"MV_ROWS_PER_THREAD": "4"}])
def test_off_or_set_knobs_keep_0003s_opts(env):
  [k] = matvec_kernels.kernels(2048, 8192, 1, "Q6_K", BASE | env)
  assert k["opts"][:3] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]], k

@pytest.mark.parametrize("qtype,K,R", [("Q6_K", 2048, 1), ("Q4_K", 1024, 1), ("Q6_K", 1024, 3), ("Q4_K", 512, 4)])
def test_rows_first_computes_the_product(qtype, K, R):
  err, matvec = matvec_kernels.product_error(qtype, K, R, BASE)
  assert matvec
  assert err < 1e-5
