"""0024-param-names-without-sizes: the C-style renderers (CUDA, the CPU's clang) name a buffer parameter by its slot alone,
`data<slot>`, as the PTX renderer does; stock 0.14.0 appended the buffer's shape (`data1_65536`). A kernel's source is the
compiled-program cache's key, so a kernel whose code does not depend on a buffer's size compiled again for every size:
a change of the model's context_length compiled the prefill chunk's attention kernels anew, whose scratch buffers follow
the context and whose code does not (CPU, fifteenth session: 4 of the tiny model's 69 kernel names, differing only in
those names; the H100's context change 4352 -> 8448 compiled 48 kernels, fourteenth session)."""
import random
import pytest

def render(ast, ren) -> str:
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
  from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite
  pm = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                       (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])
  sink = full_rewrite_to_sink(ast, ren)
  return graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), pm, ctx=ren).src[-1].arg

def kernels(capacity: int, rows: int) -> list:
  """The kernels of a sum over the first `rows` rows of a (capacity, 64) cache and a symbolic count of them: the code
  reads the same rows whatever the capacity."""
  from tinygrad import Tensor, UOp
  from tinygrad.uop.ops import Ops
  cache = Tensor.empty(capacity, 64, device="CPU")
  n = UOp.variable("n", 1, rows).bind(rows // 2)
  out = (cache[0:rows].sum(1) * 2 + cache[0:n].shrink(((0, n), (0, 64))).sum(0).sum()).contiguous()
  return [c.src[0] for c in out.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]

@pytest.mark.parametrize("renderer", ["cuda", "clang"])
def test_source_does_not_depend_on_a_buffer_size_the_code_ignores(renderer):
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer, ClangRenderer
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True) if renderer == "cuda" else ClangRenderer(Target("CPU", "", "x86_64,native"))
  rows = 32 * random.randint(1, 4)
  small, large = (kernels(rows * random.randint(2, 8), rows), kernels(rows * random.randint(9, 32), rows))
  assert len(small) == len(large) >= 2
  for a, b in zip(small, large):
    sa, sb = render(a, ren), render(b, ren)
    assert "data0" in sa and sa == sb, "stock: the parameters named after the buffers' sizes:\n" + sa[:600] + "\n" + sb[:600]
