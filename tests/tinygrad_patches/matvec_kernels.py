"""The matvec patches' tests (0017, 0020) look at one QuantWeight matvec, Q4_K or Q6_K (O x K) times R input rows, in
a subprocess whose environment sets the heuristic's MV_* knobs (tinygrad reads them once per process):
- `kernels`: each kernel's opts and facts about its CUDA source, as hand_coded_optimizations gives them for an sm_87
  CUDA renderer constructed without a GPU;
- `product_error`: the product on tinygrad's CUDA-flavoured emulator against gguf's own dequantization in float64, on
  fresh random blocks (max abs error / max abs reference), and whether the kernel was optimized as a matvec."""
import json, subprocess, sys, textwrap

RENDER = textwrap.dedent('''
  import json, sys
  import numpy as np
  from gguf import GGMLQuantizationType as QT
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite
  from orin_llm.quant import QuantWeight, empty_planes
  O, K, R, qt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), QT[sys.argv[4]]
  planes = empty_planes(qt, O, K, "CPU")
  y = QuantWeight(qt, O, K, planes)(Tensor.empty(R, K, device="CPU"))
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  pm = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                       (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])
  for call in y.linear_with_vars()[0].src:
    if call.src[0].op is not Ops.SINK: continue
    sink = full_rewrite_to_sink(call.src[0], ren)
    src = graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), pm, ctx=ren).src[-1].arg
    plane = "data2"  # the 4-bit plane's parameter (O x K/8 words): the 3rd buffer of either type (patch 0024 names a parameter by its slot)
    print(json.dumps({"opts": [[o.op.name, o.axis, o.arg] for o in sink.arg.applied_opts],
                      "uint4": f"(uint4*)(({plane}" in src, "scalar": f"(*({plane}+" in src,  # the 4-bit plane's loads
                      "float4_input": "(float4*)((data1" in src,  # the input rows' loads
                      "loops": src.count("for (")}))
''')

PRODUCT = textwrap.dedent('''
  import sys
  import numpy as np
  from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
  from gguf.quants import dequantize
  from tinygrad import Tensor
  from orin_llm.quant import QuantWeight
  rng = np.random.default_rng()
  qt, O, K, R = QT[sys.argv[1]], 16, int(sys.argv[2]), int(sys.argv[3])
  bs = GGML_QUANT_SIZES[qt][1]
  raw = rng.integers(0, 256, size=(O * K // 256, bs), dtype=np.uint8)
  at = 0 if qt == QT.Q4_K else bs - 2  # the float16 scales (Q4_K: d, dmin first; Q6_K: d last): finite
  raw[:, at:at + (4 if qt == QT.Q4_K else 2)] = np.float16(rng.uniform(1e-3, 1e-2, size=(O * K // 256, 2 if qt == QT.Q4_K else 1))).view(np.uint8)
  x = rng.normal(size=(R, K)).astype(np.float32)
  y = QuantWeight.from_raw(raw.reshape(-1), qt, O, K, "PYTHON")(Tensor(x, device="PYTHON")).numpy()
  ref = x.astype(np.float64) @ dequantize(raw.reshape(O, -1), qt).astype(np.float64).T
  print(np.abs(y - ref).max() / np.abs(ref).max())
''')

# a product as one sum (QuantWeight's plain form), unless the caller's env sets ORIN_LLM_AFFINE: the layouts these tests
# pin are those of one sum (0039 and 0040 lay out the affine form's nested sums); a few rows' Q4_K products of large
# matrices take the tensor-core form by default (quant.TC_ROWS), so it is off here
PLAIN = {"ORIN_LLM_AFFINE": "0", "ORIN_LLM_AFFINE_ROWS": "1", "ORIN_LLM_TC_ROWS": "0"}

def kernels(O: int, K: int, R: int, qtype: str, env: dict) -> list[dict]:
  r = subprocess.run([sys.executable, "-c", RENDER, str(O), str(K), str(R), qtype], env=PLAIN | env | {"DEV": "CPU"},
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]

def product_error(qtype: str, K: int, R: int, env: dict, marker: str = "MATVEC:") -> tuple[float, bool]:
  """The product's error, and whether the heuristic printed `marker` at DEBUG=3 (0003's "MATVEC:" for one sum; 0039's
  "MATVEC NESTED:", printed once its opts applied)."""
  out = subprocess.run([sys.executable, "-c", PRODUCT, qtype, str(K), str(R)], env=PLAIN | env | {"DEV": "PYTHON::sm_87", "DEBUG": "3"},
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  return float(out.stdout.strip().splitlines()[-1]), marker in out.stdout + out.stderr
