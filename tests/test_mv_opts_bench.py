"""scripts/mv_opts_bench.py's --x: the product's kernel with the input loaded as float32 (as the step has it), as
float16, or a constant (no input buffer at all: what the weights' own loads and decoding take). Built for an sm_87
CUDA renderer on the CPU; the kernel's buffers are counted, not timed."""
import sys
from collections import Counter
from pathlib import Path
import pytest
from gguf import GGMLQuantizationType as QT
from tinygrad import dtypes
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import CUDARenderer
from tinygrad.uop.ops import Ops

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import mv_opts_bench  # noqa: E402

def params(ast) -> Counter:
  """How many of the kernel's global buffers have each dtype (the output and the planes included)."""
  return Counter(u.dtype for u in ast.toposort() if u.op is Ops.PARAM)

@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
def test_input_forms(qt):
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  f = {x: params(mv_opts_bench.matvec_ast(512, 1024, 1, qt, ren, "affine", x)) for x in ("float", "half", "const")}
  # float: the output and x in float32; half: x moves to float16; const: x gone, the planes' buffers the same in all
  assert f["float"][dtypes.float32] == 2 and f["half"][dtypes.float32] == f["const"][dtypes.float32] == 1
  assert f["half"][dtypes.float16] == f["float"][dtypes.float16] + 1 == f["const"][dtypes.float16] + 1
  assert f["half"][dtypes.uint32] == f["float"][dtypes.uint32] == f["const"][dtypes.uint32] > 0

def test_tc_form_takes_the_tensor_core_opt():
  """--form tc times tc_product's product kernel (not its parts' sum): the tensor-core opt applies to it, and an opt
  with a tuple argument prints as --opts reads it back."""
  from tinygrad.codegen.opt import Opt, OptOps
  from tinygrad.codegen.opt.postrange import Scheduler
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  ast = mv_opts_bench.matvec_ast(256, 2048, 8, QT.Q4_K, ren, "tc")
  k = Scheduler(ast, ren)
  k.apply_opt(Opt(OptOps.TC, 0, (-1, 2, 1)))
  assert [mv_opts_bench.opt_text(o) for o in k.applied_opts] == ["TC:0:-1/2/1"]
  assert mv_opts_bench.opt_text(Opt(OptOps.UPCAST, 0, 4)) == "UPCAST:0:4"
