"""0039-matvec-nested-group-sums: a matvec written as a sum of groups' sums (orin_llm's affine form of a single row's
product, quant.affine_product: sum_g a[g] * sum_j x[g, j] * u[g, j]) gets a matvec's layout: lanes on the outer sum,
its innermost range first, the inner sum's ranges unrolled whole, two groups a thread's step, 4 weight rows a block. Without it the
inner sum took the heuristic's rules: one thread a weight row (the 8B's gate+up 274 us against 51.7, timed alone on an
H200; docs/PERF.md, twenty-seventh session). 0001-0038: the layout tests and the product's layout check fail.
No GPU needed for the opts (a renderer constructed without a device); the numerics run on tinygrad's CUDA-flavoured
emulator against gguf's own dequantization in float64, on fresh random blocks."""
import os
import pytest
import matvec_kernels

# (MV_NESTED_THREADS=0: 0042's rules for many or few rows' threads off, the layout as 0039 gives it)
BASE = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | {"ORIN_LLM_AFFINE": "1", "MV_NESTED_THREADS": "0"}
# Q6_K's groups of 16 (2 words): two groups a thread's step, the outer loop unrolled by 2 (groups of 32 or more, as
# Q8_0's and Q4_K's, take two weight rows a thread instead)
NESTED = [["LOCAL", 0, 4], ["GROUP", 3, 4], ["GROUP", 2, 8], ["UNROLL", 2, 0], ["UNROLL", 2, 0], ["UNROLL", 2, 2]]

def product_kernel(O, K, R, qtype, env):
  return max(matvec_kernels.kernels(O, K, R, qtype, env), key=lambda k: len(k["opts"]))

@pytest.mark.parametrize("qtype,O,K", [
  ("Q6_K", 16384, 2048),   # the 1B's gate+up: groups of 16 (2 words)
  ("Q6_K", 3072, 2048),    # the 1B's Q/K/V
  ("Q6_K", 4096, 14336),   # the 8B's ffn_down: 448 groups of 32 a row's outer sum
  ("Q6_K", 128256, 2048),  # the 1B's output head
])
def test_single_row_in_groups_gets_lanes_on_the_outer_sum(qtype, O, K):
  k = product_kernel(O, K, 1, qtype, BASE)
  assert k["opts"] == NESTED
  assert k["float4_input"]  # the inner sum unrolled: a group's input in vectors

def test_groups_of_32_take_two_weight_rows():
  # Q8_0 (groups of 32, no minimum): two weight rows a thread, the input's loads shared, lanes on the outer sum
  k = product_kernel(16384, 2048, 1, "Q8_0", BASE)
  assert k["opts"] == [["UPCAST", 0, 2], ["LOCAL", 0, 4], ["GROUP", 2, 32], ["UNROLL", 1, 0], ["UNROLL", 1, 0]]

def test_off_switch():
  k = product_kernel(16384, 2048, 1, "Q6_K", BASE | {"MV_NESTED": "0"})
  assert k["opts"] != NESTED and not any(o[0] == "GROUP" for o in k["opts"])

def test_one_sum_is_unchanged():
  # the plain form (one reduce) keeps 0022's single-row layout
  [k] = matvec_kernels.kernels(16384, 2048, 1, "Q6_K", {**BASE, "ORIN_LLM_AFFINE": "0"})
  assert k["opts"] == [["LOCAL", 0, 4], ["GROUP", 0, 32], ["UNROLL", 3, 0]]

@pytest.mark.parametrize("qtype", ["Q6_K"])
def test_product_in_groups_matches_gguf(qtype):
  err, laid_out = matvec_kernels.product_error(qtype, 2048, 1, BASE, marker="MATVEC NESTED:")
  assert laid_out and err < 1e-5
