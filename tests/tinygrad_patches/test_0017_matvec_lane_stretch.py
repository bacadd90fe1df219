"""0017-matvec-lane-stretch: with MV_LANE_UNROLL=n the matvec heuristic (0003, 0013) gives each thread of a row's group
n consecutive elements of the first reduce range, unrolled, before the GROUP: for a Q4_K weight (its first reduce range
is the words of the 4-bit plane) a thread reads 4 words in one 16-byte load instead of one word, and the input in
float4s; for a Q6_K weight, whose group already gives each thread a scale word's 64 elements, the ranges that walk
them (but the innermost) are unrolled after the GROUP, and its 4-bit and 2-bit planes load in 16-byte vectors.
Stock and 0001-0016 ignore MV_LANE_UNROLL: each thread reads one word of a plane at a time.
No GPU needed for the opts and the CUDA source (a renderer constructed without a device); the numerics run on
tinygrad's CUDA-flavoured emulator against gguf's own dequantization in float64."""
import os
import pytest
import matvec_kernels

# these tests pin 0003's (and 0013's, 0017's) opts: 0020's unroll of the innermost range is off here
pytestmark = pytest.mark.usefixtures("without_inner_unroll")

def kernels(O, K, R, qtype, lane_unroll):
  env = {k: v for k, v in os.environ.items() if k != "MV_LANE_UNROLL"} | ({"MV_LANE_UNROLL": str(lane_unroll)} if lane_unroll else {})
  return matvec_kernels.kernels(O, K, R, qtype, env)

@pytest.mark.parametrize("rows", [1, 4, 8])
def test_q4_k_threads_read_four_words_at_once(rows):
  [k] = kernels(1024, 4096, rows, "Q4_K", 4)
  # the 4 words first, then the warp over the rest of the words, 4 weight rows a thread, the nibbles 4 at a time
  assert k["opts"][:5] == [["UNROLL", 0, 4], ["GROUP", 0, 32], ["LOCAL", rows > 1, 4], ["UPCAST", rows > 1, 4], ["UNROLL", 2, 4]], k
  assert k["uint4"] and not k["scalar"], k

@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("K", [2048, 4096])
def test_q6_k_threads_read_their_stretch_in_vectors(rows, K):
  # Q6_K's first reduce range is its scale words (K/64): a thread of the group owns a scale word's 64 elements, walked
  # by (4 scale bytes, 2 halves, 8 nibbles) after the loop over the rest of the words; the 4 and the 2 are unrolled
  [k] = kernels(1024, K, rows, "Q6_K", 4)
  assert k["opts"][0] == ["GROUP", 0, 32] and sum(o[0] == "UNROLL" and o[2] == 0 for o in k["opts"]) == 2, k
  assert k["uint4"] and not k["scalar"], k

@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_off_by_default(qtype):
  [k] = kernels(1024, 4096, 1, qtype, 0)
  assert k["opts"] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]] and k["scalar"] and not k["uint4"], k

@pytest.mark.parametrize("qtype,K", [("Q4_K", 1024), ("Q6_K", 2048)])
def test_lane_stretch_computes_the_product(qtype, K):
  err, matvec = matvec_kernels.product_error(qtype, K, 2, {**os.environ, "MV_LANE_UNROLL": "4"})
  assert matvec  # optimized as a matvec
  assert err < 1e-5
