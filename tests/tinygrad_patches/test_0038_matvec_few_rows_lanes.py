"""0038-matvec-few-rows-lanes: on NVIDIA (0022's rows-first layout), a matvec of a few input rows (2-8: a batch of decode
tokens, a verify step) takes lanes a row for each thread's share of the reduce to be 256 elements (8 for a 2048-long row,
64 at most), more where fewer than MV_ROWS_THREADS (16384) threads would run, 4 weight rows a block with 8 lanes, and the
reduce range before the innermost unrolled too where it is short. 0022 gave every shape 32 lanes, 2 weight rows a block.
Timed alone with a cold L2 on an H200 (docs/PERF.md, twenty-sixth session), 8 rows: the 1B's gate+up 75.3 -> 58.0 us,
its output head 482 -> 285, ffn_down 65.7 -> 46.6, the 8B's gate+up 137 -> 119; the 1B's batch steps of 2, 4 and 8 rows
12%, 10% and 13% faster at BEAM=0, single rows unchanged. 0001-0037: the layouts below are 0022's.
No GPU needed for the opts (a renderer constructed without a device); the numerics run on tinygrad's CUDA-flavoured
emulator against gguf's own dequantization in float64, on fresh random blocks."""
import os
import pytest
import matvec_kernels

BASE = {k: v for k, v in os.environ.items() if not k.startswith("MV_")}
UP4 = ["UPCAST", 1, 4]

@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("qtype,O,K,opts", [
  # a 2048-long row of many weight rows (the 1B's gate+up, its output head): 8 lanes, 4 weight rows a block
  ("Q6_K", 16384, 2048, [UP4, ["LOCAL", 1, 4], ["GROUP", 0, 8], ["UNROLL", 4, 0], ["UNROLL", 3, 0]]),
  ("Q6_K", 128256, 2048, [UP4, ["LOCAL", 1, 4], ["GROUP", 0, 8], ["UNROLL", 4, 0], ["UNROLL", 3, 0]]),
  # few weight rows (the 1B's Q/K/V): 32 lanes, so that 768 x 32 threads run
  ("Q6_K", 3072, 2048, [UP4, ["LOCAL", 1, 2], ["GROUP", 0, 32], ["UNROLL", 3, 0], ["UNROLL", 2, 0]]),
  # an 8192-long row (the 1B's ffn_down): 32 lanes by its length and its 2048 weight rows
  ("Q6_K", 2048, 8192, [UP4, ["LOCAL", 1, 2], ["GROUP", 0, 32], ["UNROLL", 4, 0], ["UNROLL", 3, 0]]),
  # a 4096-long row (the 8B's gate+up): 16 lanes by its length, though 8 would give enough threads
  ("Q4_K", 28672, 4096, [UP4, ["LOCAL", 1, 2], ["GROUP", 0, 16], ["UNROLL", 2, 0]]),
])
def test_lanes_follow_the_row_length_and_the_thread_count(R, qtype, O, K, opts):
  [k] = matvec_kernels.kernels(O, K, R, qtype, BASE)
  assert k["opts"] == opts + [["UPCAST", 0, 0]], k
  assert k["float4_input"], k

def test_rows_that_do_not_divide_by_a_block_of_4_keep_2():
  # 8200 weight rows: 8 lanes by the row's length, but 4 rows a thread x 4 a block does not divide them
  [k] = matvec_kernels.kernels(8200, 2048, 8, "Q4_K", BASE)
  assert k["opts"] == [UP4, ["LOCAL", 1, 2], ["GROUP", 0, 8], ["UNROLL", 2, 0], ["UPCAST", 0, 0]], k

def test_the_groups_loop_is_not_unrolled():
  # a 256-long row: the GROUP of 8 leaves a loop of the first range, which the second unroll does not take
  [k] = matvec_kernels.kernels(16384, 256, 8, "Q4_K", BASE)
  assert k["opts"] == [UP4, ["LOCAL", 1, 4], ["GROUP", 0, 8], ["UNROLL", 2, 0], ["UPCAST", 0, 0]], k

def test_off_gives_0022s_layout():
  [k] = matvec_kernels.kernels(16384, 2048, 8, "Q6_K", BASE | {"MV_ROWS_THREADS": "0"})
  assert k["opts"] == [UP4, ["LOCAL", 1, 2], ["GROUP", 0, 32], ["UNROLL", 3, 0], ["UPCAST", 0, 0]], k

def test_single_rows_are_unchanged():
  [k] = matvec_kernels.kernels(16384, 2048, 1, "Q6_K", BASE)
  assert k["opts"] == [["LOCAL", 0, 4], ["GROUP", 0, 32], ["UNROLL", 3, 0]], k

# the emulator's product has 16 weight rows: 64 lanes by the thread count; MV_ROWS_THREADS=1 gives them the lanes of the
# row's length as the large matrices get them (8 lanes and 4 rows a block for 2048, 16 lanes for 4096)
@pytest.mark.parametrize("qtype,K,R,env", [("Q6_K", 2048, 8, {}), ("Q4_K", 4096, 8, {}), ("Q6_K", 1024, 2, {}), ("Q4_K", 512, 4, {}),
                                           ("Q6_K", 2048, 8, {"MV_ROWS_THREADS": "1"}), ("Q4_K", 4096, 4, {"MV_ROWS_THREADS": "1"})])
def test_few_rows_lanes_compute_the_product(qtype, K, R, env):
  err, matvec = matvec_kernels.product_error(qtype, K, R, BASE | env)
  assert matvec
  assert err < 1e-5
