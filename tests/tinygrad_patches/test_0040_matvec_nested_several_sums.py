"""0040-matvec-nested-several-sums: 0039's layout for a sum of groups' sums with more than one sum in each group. A type
with a minimum of its own (Q4_K: w = a[g] * u + b[g]) takes, besides each group's sum of x * u, each group's sum of x
(quant.affine_product sums it per weight row, so that it sits in the product's kernel): two inner reduces under the outer
one. 0039 took exactly one inner reduce; the second made tinygrad's rules split the group sums of x into a kernel of
their own for every input (the 8B Q4_K_M: 432 -> 544 kernels a token, its decode 8.7% slower; docs/PERF.md,
twenty-seventh session); summed per weight row it is one kernel, but one thread a weight row. 0001-0039: the layout
tests and the product's layout check fail.
No GPU needed for the opts; the numerics run on tinygrad's CUDA-flavoured emulator against gguf's float64."""
import os
import pytest
import matvec_kernels

BASE = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | {"ORIN_LLM_AFFINE": "Q4_K"}
# groups of 32: two weight rows a thread (the input's loads and its group sums shared), lanes on the outer sum, both
# inner sums unrolled whole
NESTED = [["UPCAST", 0, 2], ["LOCAL", 0, 4], ["GROUP", 4, 4], ["GROUP", 3, 8], ["UNROLL", 2, 0], ["UNROLL", 2, 0], ["UNROLL", 2, 0]]

@pytest.mark.parametrize("O,K", [
  (28672, 4096),  # the 8B's gate+up
  (4096, 4096),   # the 8B's Q
  (16384, 2048),  # the 1B's gate+up
])
def test_group_sums_of_the_input_in_the_products_kernel(O, K):
  ks = matvec_kernels.kernels(O, K, 1, "Q4_K", BASE)
  assert len(ks) == 1  # no kernel of the input's group sums of its own
  assert ks[0]["opts"] == NESTED and ks[0]["float4_input"]

def test_off_switch():
  ks = matvec_kernels.kernels(28672, 4096, 1, "Q4_K", BASE | {"MV_NESTED": "0"})
  assert not any(k["opts"] == NESTED for k in ks)

def test_product_with_minimum_matches_gguf():
  err, laid_out = matvec_kernels.product_error("Q4_K", 2048, 1, BASE, marker="MATVEC NESTED:")
  assert laid_out and err < 1e-5
