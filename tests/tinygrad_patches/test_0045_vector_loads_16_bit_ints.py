"""0045-vector-loads-16-bit-ints: loads of 16-bit integers (ushort, short) are folded into vectors as 32-bit and
float16 ones are, and CUDA names them by its own vector types (ushort2, ushort4). orin_llm keeps Q6_K's 2-bit codes in
16-bit units (quant.py: qh2); stock tinygrad and 0001-0044 load every unit alone (the first test fails: no ushort4 in
the source, `unsigned short` scalar loads). Rendered for CUDA (sm_87, no GPU); then the same kernels run on tinygrad's
CPU backend (its clang vectors) against numpy on fresh random integers, every bit pattern allowed."""
import re
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import CUDARenderer
from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite

_PM = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                      (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])

def cuda_source(t: Tensor) -> str:
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  srcs = []
  for call in t.linear_with_vars()[0].src:
    if call.op is Ops.CALL and call.src[0].op is Ops.SINK:
      sink = full_rewrite_to_sink(call.src[0], ren)
      srcs.append(graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), _PM, ctx=ren).src[-1].arg)
  return "\n".join(srcs)

def four_a_thread(x: Tensor) -> Tensor:
  """Each output sums 4 consecutive units (as uint32): a thread's 4 loads are adjacent, one 8-byte vector."""
  return x.reshape(-1, 4).cast(dtypes.uint32).sum(-1)

@pytest.mark.parametrize("dt,name", [(dtypes.uint16, "ushort"), (dtypes.int16, "short")])
def test_cuda_loads_16_bit_ints_in_vectors(dt, name):
  src = cuda_source(four_a_thread(Tensor.empty(4096, dtype=dt, device="CPU")))
  assert re.search(rf"\b{name}4 val\d+ = \(\*\(\({name}4\*\)", src), src
  assert not re.search(r"unsigned short val\d+ = \(\*\(data", src), src  # no scalar 2-byte load left

def test_unsigned_short_pairs_make_words():
  """Units read as the 32-bit words they make (Tensor.bitcast, as quant.py's one-sum products read Q6_K's qh2): in vector
  loads (ushort2 or ushort4), and the type's name is declared (typedef ushort)."""
  src = cuda_source((Tensor.empty(4096, dtype=dtypes.uint16, device="CPU").bitcast(dtypes.uint32) >> 3) & 0x55555555)
  assert "typedef unsigned short ushort;" in src and re.search(r"\bushort([24]) val\d+ = \(\*\(\(ushort\1\*\)", src), src

@pytest.mark.parametrize("dt,np_dt", [(dtypes.uint16, np.uint16), (dtypes.int16, np.int16)])
def test_values_on_the_cpu(dt, np_dt, rng):
  bits = rng.integers(0, 1 << 16, size=8192, dtype=np.uint32).astype(np.uint16).view(np_dt)
  x = Tensor(bits, device="CPU")
  got = four_a_thread(x).numpy()
  want = bits.reshape(-1, 4).astype(np.int64).astype(np.uint32).sum(-1, dtype=np.uint32)
  assert np.array_equal(got, want)
  if dt == dtypes.uint16:
    words = x.bitcast(dtypes.uint32).numpy()
    assert np.array_equal(words, bits.view(np.uint32))
