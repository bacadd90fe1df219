"""0020-matvec-inner-unroll: the matvec heuristic (0003) unrolls a single row's innermost reduce range, the 8 elements
of a packed word of Q4_K and Q6_K, whole (MV_INNER_UNROLL, default 8): its shifts become constants and the input row
loads as float4s. Every single-row matvec that a full BEAM search found fastest on an H100 had that unroll, and with
it a 1B Q6_K file decoded at BEAM=0 at 476 tokens/s instead of 286 (docs/PERF.md, thirteenth session).
0001-0019 leave the range rolled: one scalar load of the input per element, shifts by a loop counter.
Few-row kernels (0013) keep their own unroll (MV_ROWS_UNROLL). No GPU needed for the opts and the CUDA source (a
renderer constructed without a device); the numerics run on tinygrad's CUDA-flavoured emulator against gguf's own
dequantization in float64, on fresh random blocks."""
import json, os, subprocess, sys, textwrap
import pytest

# prints, for each kernel of a Q4_K or Q6_K weight (O x K) times R input rows: its opts, the full shape's last reduce
# axis type, and whether the input row (the float32 buffer of K*R elements) is read in float4s
RENDER = textwrap.dedent('''
  import json, sys
  import numpy as np
  from gguf import GGMLQuantizationType as QT
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite
  from orin_llm.quant import QuantWeight, _FAST_PLANES
  O, K, R, qt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), QT[sys.argv[4]]
  planes = {n: Tensor.empty(O, K // 256 * w, dtype=dtypes.uint32 if dt is np.uint32 else dtypes.float16, device="CPU")
            for n, w, dt in _FAST_PLANES[qt]}
  y = QuantWeight(qt, O, K, planes)(Tensor.empty(R, K, device="CPU"))
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  pm = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                       (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])
  for call in y.linear_with_vars()[0].src:
    if call.src[0].op is not Ops.SINK: continue
    sink = full_rewrite_to_sink(call.src[0], ren)
    src = graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), pm, ctx=ren).src[-1].arg
    print(json.dumps({"opts": [[o.op.name, o.axis, o.arg] for o in sink.arg.applied_opts],
                      "float4_input": f"(float4*)((data1_{K * R}" in src, "loops": src.count("for (")}))
''')

def kernels(tmp_path, O, K, R, qtype, inner=None):
  (tmp_path / "render.py").write_text(RENDER)
  env = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | ({"MV_INNER_UNROLL": str(inner)} if inner is not None else {})
  r = subprocess.run([sys.executable, str(tmp_path / "render.py"), str(O), str(K), str(R), qtype], env=env | {"DEV": "CPU"},
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]

@pytest.mark.parametrize("qtype,O,K", [("Q6_K", 16384, 2048), ("Q6_K", 2048, 8192), ("Q4_K", 4096, 4096), ("Q4_K", 1024, 14336)])
def test_single_row_unrolls_the_words_elements(tmp_path, qtype, O, K):
  [k] = kernels(tmp_path, O, K, 1, qtype)
  # the warp-per-row opts of 0003, then the innermost range (8 elements of a word) unrolled whole
  assert k["opts"][:3] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]], k
  assert k["opts"][3][0] == "UNROLL" and k["opts"][3][2] == 0 and len(k["opts"]) == 4, k
  assert k["float4_input"], k

def test_off_leaves_the_range_rolled(tmp_path):
  [on] = kernels(tmp_path, 16384, 2048, 1, "Q6_K")
  [off] = kernels(tmp_path, 16384, 2048, 1, "Q6_K", inner=0)
  assert off["opts"] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]] and not off["float4_input"], off
  assert off["loops"] == on["loops"] + 1, (on, off)

def test_few_rows_keep_their_own_unroll(tmp_path):
  # 0013's few-row matvec: the innermost range unrolled by MV_ROWS_UNROLL (4), the rows upcast whole; no second unroll
  [k] = kernels(tmp_path, 1024, 4096, 8, "Q4_K")
  assert k["opts"] == [["GROUP", 0, 32], ["LOCAL", 1, 4], ["UPCAST", 1, 4], ["UNROLL", 2, 4], ["UPCAST", 0, 0]], k

@pytest.mark.parametrize("qtype,K", [("Q4_K", 1024), ("Q6_K", 2048)])
def test_unrolled_matvec_computes_the_product(qtype, K):
  code = textwrap.dedent('''
    import sys
    import numpy as np
    from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
    from gguf.quants import dequantize
    from tinygrad import Tensor
    from orin_llm.quant import QuantWeight
    rng = np.random.default_rng()
    qt, O, K, R = QT[sys.argv[1]], 16, int(sys.argv[2]), 1
    bs = GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, size=(O * K // 256, bs), dtype=np.uint8)
    at = 0 if qt == QT.Q4_K else bs - 2  # the float16 scales (Q4_K: d, dmin first; Q6_K: d last): finite
    raw[:, at:at + (4 if qt == QT.Q4_K else 2)] = np.float16(rng.uniform(1e-3, 1e-2, size=(O * K // 256, 2 if qt == QT.Q4_K else 1))).view(np.uint8)
    x = rng.normal(size=(R, K)).astype(np.float32)
    y = QuantWeight.from_raw(raw.reshape(-1), qt, O, K, "PYTHON")(Tensor(x, device="PYTHON")).numpy()
    ref = x.astype(np.float64) @ dequantize(raw.reshape(O, -1), qt).astype(np.float64).T
    print(np.abs(y - ref).max() / np.abs(ref).max())
  ''')
  env = {k: v for k, v in os.environ.items() if not k.startswith("MV_")} | {"DEV": "PYTHON::sm_87", "DEBUG": "3"}
  out = subprocess.run([sys.executable, "-c", code, qtype, str(K)], env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "MATVEC:" in out.stdout + out.stderr  # optimized as a matvec
  assert float(out.stdout.strip().splitlines()[-1]) < 1e-5
