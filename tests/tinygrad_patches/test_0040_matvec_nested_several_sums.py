"""0040-matvec-nested-several-sums: 0039's layout for a sum of groups' sums with more than one sum in each group. A type
with a minimum of its own (Q4_K: w = a[g] * u + b[g]) takes, besides each group's sum of x * u, each group's sum of x
(quant.affine_product sums it per weight row, so that it sits in the product's kernel): two inner reduces under the outer
one. 0039 took exactly one inner reduce; the second made tinygrad's rules split the group sums of x into a kernel of
their own for every input (the 8B Q4_K_M: 432 -> 544 kernels a token, its decode 8.7% slower; docs/PERF.md,
twenty-seventh session); summed per weight row it is one kernel, but one thread a weight row. 0001-0039: the layout
tests and the product's layout check fail. The inner sums must be side by side: a chain of three is left to the rules.
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
  # the 8B's gate+up (458752 threads, over 2x MV_NESTED_THREADS) then takes 4 weight rows a thread (patch 0047)
  assert ks[0]["opts"] == NESTED + ([["UPCAST", 0, 4]] if O == 28672 else []) and ks[0]["float4_input"]

def test_a_few_rows():
  # a batch step's 4 rows (ORIN_LLM_AFFINE_ROWS): each an UPCAST, the layout otherwise a single row's
  [k] = matvec_kernels.kernels(16384, 2048, 4, "Q4_K", BASE | {"ORIN_LLM_AFFINE_ROWS": "4"})
  assert k["opts"] == [["UPCAST", 1, 2], ["LOCAL", 1, 4], ["GROUP", 4, 4], ["GROUP", 3, 8], ["UNROLL", 2, 0],
                       ["UNROLL", 2, 0], ["UNROLL", 2, 0], ["UPCAST", 0, 0]]

def test_off_switch():
  ks = matvec_kernels.kernels(28672, 4096, 1, "Q4_K", BASE | {"MV_NESTED": "0"})
  assert not any(k["opts"] == NESTED or any(o[0] == "GROUP" for o in k["opts"]) for k in ks)

def test_a_chain_of_sums_is_not_taken():
  """sum_g a * sum_j (b * sum_k c): three nested sums, not two side by side; 0040's widened condition took it (both inner
  ranges unrolled whole, 256 bodies a step) until the inner sums had to be siblings."""
  from tinygrad import Tensor
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  a, b, c = Tensor.empty(64, 4, device="CPU"), Tensor.empty(64, 4, 16, device="CPU"), Tensor.empty(64, 4, 16, 16, device="CPU")
  y = (a * (b * c.sum(-1)).sum(-1)).sum(-1)
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  [sink] = [full_rewrite_to_sink(c.src[0], ren) for c in y.linear_with_vars()[0].src if c.src[0].op is Ops.SINK]
  assert not any(o.op.name == "GROUP" for o in sink.arg.applied_opts)

def test_product_with_minimum_matches_gguf():
  err, laid_out = matvec_kernels.product_error("Q4_K", 2048, 1, BASE, marker="MATVEC NESTED:")
  assert laid_out and err < 1e-5
