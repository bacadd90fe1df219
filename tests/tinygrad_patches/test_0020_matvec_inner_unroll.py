"""0020-matvec-inner-unroll: the matvec heuristic (0003) unrolls a single row's innermost reduce range, the 8 elements
of a packed word of Q4_K and Q6_K, whole (MV_INNER_UNROLL, default 8): its shifts become constants and the input row
loads as float4s. Every single-row matvec that a full BEAM search found fastest on an H100 had that unroll, and with
it a 1B Q6_K file decoded at BEAM=0 at 476 tokens/s instead of 286 (docs/PERF.md, thirteenth session).
0001-0019 leave the range rolled: one scalar load of the input per element, shifts by a loop counter.
Few-row kernels (0013) keep their own unroll (MV_ROWS_UNROLL). No GPU needed for the opts and the CUDA source (a
renderer constructed without a device); the numerics run on tinygrad's CUDA-flavoured emulator against gguf's own
dequantization in float64, on fresh random blocks."""
import os
import pytest
import matvec_kernels

pytestmark = pytest.mark.usefixtures("without_rows_first")

def kernels(O, K, R, qtype, inner=None):
  # (0022's rows-first layout off: these pin 0003's GROUP 32, LOCAL 4, UPCAST 4)
  env = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | {"MV_ROWS_FIRST": "0"} | \
        ({"MV_INNER_UNROLL": str(inner)} if inner is not None else {})
  return matvec_kernels.kernels(O, K, R, qtype, env)

@pytest.mark.parametrize("qtype,O,K", [("Q6_K", 16384, 2048), ("Q6_K", 2048, 8192), ("Q4_K", 4096, 4096), ("Q4_K", 1024, 14336)])
def test_single_row_unrolls_the_words_elements(qtype, O, K):
  [k] = kernels(O, K, 1, qtype)
  # the warp-per-row opts of 0003, then the innermost range (8 elements of a word) unrolled whole
  assert k["opts"][:3] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]], k
  assert k["opts"][3][0] == "UNROLL" and k["opts"][3][2] == 0 and len(k["opts"]) == 4, k
  assert k["float4_input"], k

def test_off_leaves_the_range_rolled():
  [on] = kernels(16384, 2048, 1, "Q6_K")
  [off] = kernels(16384, 2048, 1, "Q6_K", inner=0)
  assert off["opts"] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]] and not off["float4_input"], off
  assert off["loops"] == on["loops"] + 1, (on, off)

def test_few_rows_keep_their_own_unroll():
  # 0013's few-row matvec: the innermost range unrolled by MV_ROWS_UNROLL (4), the rows upcast whole; no second unroll
  [k] = kernels(1024, 4096, 8, "Q4_K")
  assert k["opts"] == [["GROUP", 0, 32], ["LOCAL", 1, 4], ["UPCAST", 1, 4], ["UNROLL", 2, 4], ["UPCAST", 0, 0]], k

@pytest.mark.parametrize("qtype,K", [("Q4_K", 1024), ("Q6_K", 2048)])
def test_unrolled_matvec_computes_the_product(qtype, K):
  err, matvec = matvec_kernels.product_error(qtype, K, 1, {k: v for k, v in os.environ.items() if not k.startswith("MV_")})
  assert matvec  # optimized as a matvec
  assert err < 1e-5
