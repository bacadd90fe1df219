"""0017-matvec-lane-stretch: with MV_LANE_UNROLL=n the matvec heuristic (0003, 0013) gives each thread of a row's group
n consecutive elements of the first reduce range, unrolled, before the GROUP: for a Q4_K weight (its first reduce range
is the words of the 4-bit plane) a thread reads 4 words in one 16-byte load instead of one word, and the input in
float4s; for a Q6_K weight, whose group already gives each thread a scale word's 64 elements, the ranges that walk
them (but the innermost) are unrolled after the GROUP, and its 4-bit and 2-bit planes load in 16-byte vectors.
Stock and 0001-0016 ignore MV_LANE_UNROLL: each thread reads one word of a plane at a time.
No GPU needed for the opts and the CUDA source (a renderer constructed without a device); the numerics run on
tinygrad's CUDA-flavoured emulator against gguf's own dequantization in float64."""
import json, os, subprocess, sys, textwrap
import pytest

# these tests pin 0003's (and 0013's, 0017's) opts: 0020's unroll of the innermost range is off here
pytestmark = pytest.mark.usefixtures("without_inner_unroll")

# prints, for each kernel of a Q4_K or Q6_K weight (O x K) times R input rows: its opts and whether the 4-bit plane is
# read in 16-byte loads, as hand_coded_optimizations gives them for an sm_87 CUDA renderer
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
    plane = f"data2_{O * K // 8}"  # the 4-bit plane's parameter (O x K/8 words): the 3rd buffer of either type
    print(json.dumps({"opts": [[o.op.name, o.axis, o.arg] for o in sink.arg.applied_opts],
                      "uint4": f"(uint4*)(({plane}" in src, "scalar": f"(*({plane}+" in src}))
''')

def kernels(tmp_path, O, K, R, qtype, lane_unroll):
  (tmp_path / "render.py").write_text(RENDER)
  env = {k: v for k, v in os.environ.items() if k != "MV_LANE_UNROLL"} | ({"MV_LANE_UNROLL": str(lane_unroll)} if lane_unroll else {})
  r = subprocess.run([sys.executable, str(tmp_path / "render.py"), str(O), str(K), str(R), qtype], env=env | {"DEV": "CPU"},
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]

@pytest.mark.parametrize("rows", [1, 4, 8])
def test_q4_k_threads_read_four_words_at_once(tmp_path, rows):
  [k] = kernels(tmp_path, 1024, 4096, rows, "Q4_K", 4)
  # the 4 words first, then the warp over the rest of the words, 4 weight rows a thread, the nibbles 4 at a time
  assert k["opts"][:5] == [["UNROLL", 0, 4], ["GROUP", 0, 32], ["LOCAL", rows > 1, 4], ["UPCAST", rows > 1, 4], ["UNROLL", 2, 4]], k
  assert k["uint4"] and not k["scalar"], k

@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("K", [2048, 4096])
def test_q6_k_threads_read_their_stretch_in_vectors(tmp_path, rows, K):
  # Q6_K's first reduce range is its scale words (K/64): a thread of the group owns a scale word's 64 elements, walked
  # by (4 scale bytes, 2 halves, 8 nibbles) after the loop over the rest of the words; the 4 and the 2 are unrolled
  [k] = kernels(tmp_path, 1024, K, rows, "Q6_K", 4)
  assert k["opts"][0] == ["GROUP", 0, 32] and sum(o[0] == "UNROLL" and o[2] == 0 for o in k["opts"]) == 2, k
  assert k["uint4"] and not k["scalar"], k

@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_off_by_default(tmp_path, qtype):
  [k] = kernels(tmp_path, 1024, 4096, 1, qtype, 0)
  assert k["opts"] == [["GROUP", 0, 32], ["LOCAL", 0, 4], ["UPCAST", 0, 4]] and k["scalar"] and not k["uint4"], k

@pytest.mark.parametrize("qtype,K", [("Q4_K", 1024), ("Q6_K", 2048)])
def test_lane_stretch_computes_the_product(qtype, K):
  code = textwrap.dedent('''
    import sys
    import numpy as np
    from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
    from gguf.quants import dequantize
    from tinygrad import Tensor
    from orin_llm.quant import QuantWeight
    rng = np.random.default_rng()
    qt, O, K, R = QT[sys.argv[1]], 16, int(sys.argv[2]), 2
    bs = GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, size=(O * K // 256, bs), dtype=np.uint8)
    at = 0 if qt == QT.Q4_K else bs - 2  # the float16 scales (Q4_K: d, dmin first; Q6_K: d last): finite
    raw[:, at:at + (4 if qt == QT.Q4_K else 2)] = np.float16(rng.uniform(1e-3, 1e-2, size=(O * K // 256, 2 if qt == QT.Q4_K else 1))).view(np.uint8)
    x = rng.normal(size=(R, K)).astype(np.float32)
    y = QuantWeight.from_raw(raw.reshape(-1), qt, O, K, "PYTHON")(Tensor(x, device="PYTHON")).numpy()
    ref = x.astype(np.float64) @ dequantize(raw.reshape(O, -1), qt).astype(np.float64).T
    print(np.abs(y - ref).max() / np.abs(ref).max())
  ''')
  env = {**os.environ, "DEV": "PYTHON::sm_87", "DEBUG": "3", "MV_LANE_UNROLL": "4"}
  out = subprocess.run([sys.executable, "-c", code, qtype, str(K)], env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "MATVEC:" in out.stdout + out.stderr  # optimized as a matvec
  assert float(out.stdout.strip().splitlines()[-1]) < 1e-5
