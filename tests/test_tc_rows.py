"""ORIN_LLM_TC_ROWS (quant.TC_ROWS, default 4): a few rows' product in the fused tensor-core form
(quant.tc_product). Against gguf's dequantization in float64 on the CPU; as one kernel (the dequantized float16 matrix
not written to memory) that tinygrad's tensor-core opt takes, rendered for sm_90; the knob's refusals and its place in
the steps file's key."""
import re
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from tinygrad import Tensor, dtypes
from orin_llm import quant
from orin_llm.errors import OrinError
from orin_llm.quant import QuantWeight, tc_product, tc_rows

def random_raw(qtype, O, K, rng):
  """Random blocks of qtype with finite, small float16 scales (random bytes there would give infinities)."""
  block, bsize = GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, size=(O * K // block, bsize), dtype=np.uint8)
  halves = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q4_1: (0, 2), QT.Q5_1: (0, 2), QT.Q6_K: (bsize - 2, 1)}.get(qtype, (0, 1))
  raw[:, halves[0]:halves[0] + 2 * halves[1]] = rng.uniform(1e-3, 1e-2, size=(raw.shape[0], halves[1])).astype(np.float16).view(np.uint8)
  return raw

# the reduction's parts (quant.tc_parts): with TC_WARPS 0, K=512 whole and K=2048 in two; with the default, the 16-row
# matrix (one warp's tile short) takes the most parts, 256 long: 2 and 8
@pytest.mark.parametrize("warps", [0, 1024])
@pytest.mark.parametrize("K", [512, 2048])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q5_K, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1], ids=lambda q: q.name)
def test_tc_product_matches_gguf(qtype, K, warps, rng, monkeypatch):
  """Rounded to float16 in its pieces (a, b, then u*a + b) with float32 sums: within 3e-3 of the float64 product at the
  output's scale (a float16 matrix rounds each weight by up to 2^-11 relative; the error of a wrong scale or group
  is of the output's own size)."""
  monkeypatch.setattr(quant, "TC_WARPS", warps)
  O, R = 16, int(rng.integers(2, 9))
  assert quant.tc_parts(K, O) == {(0, 512): 1, (0, 2048): 2, (1024, 512): 2, (1024, 2048): 8}[warps, K]
  raw = random_raw(qtype, O, K, rng)
  x = rng.normal(size=(R, K)).astype(np.float32)
  qw = QuantWeight.from_raw(raw.reshape(-1), qtype, O, K, "CPU")
  y = tc_product(Tensor(x, device="CPU"), qw.planes, qtype).numpy()
  ref = x.astype(np.float64) @ gguf_dequantize(raw.reshape(O, -1), qtype).astype(np.float64).T
  assert y.dtype == np.float32 and y.shape == (R, O)
  assert np.abs(y - ref).max() / np.abs(ref).max() < 3e-3

@pytest.mark.parametrize("qtype", list(quant.PAIR_TYPES), ids=lambda q: q.name)
def test_pair_codes(qtype, rng, monkeypatch):
  """ORIN_LLM_TC_PAIRS=1: quant.pair_codes gives half_codes' float16 codes (themselves affine()'s u, test_half_codes)
  to the bit in the order [0, 4, 1, 5, 2, 6, 3, 7] of each q4 word, and pair_order puts the input in the same order, so
  the form's product is the same sum: within 3e-3 of gguf's float64 product as in test_tc_product_matches_gguf. In the
  product's CUDA source the codes are made two at a time (the bit pattern of 1024 in both halves of a word)."""
  assert quant.pair_order(Tensor(np.arange(16, dtype=np.float32))).tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
  O, K, R = 16, 2048, int(rng.integers(2, 9))
  raw = random_raw(qtype, O, K, rng)
  qw = QuantWeight.from_raw(raw.reshape(-1), qtype, O, K, "CPU")
  got, want = quant.pair_codes(qw.planes, qtype).numpy(), quant.pair_order(quant.half_codes(qw.planes, qtype)).numpy()
  assert got.dtype == np.float16 and np.array_equal(got, want) and len(np.unique(got)) > 8
  x = rng.normal(size=(R, K)).astype(np.float32)
  ref = x.astype(np.float64) @ gguf_dequantize(raw.reshape(O, -1), qtype).astype(np.float64).T
  monkeypatch.setattr(quant, "TC_PAIRS", 1)
  y = tc_product(Tensor(x, device="CPU"), qw.planes, qtype).numpy()
  assert np.abs(y - ref).max() / np.abs(ref).max() < 3e-3
  monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
  from render_kernels import render
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  ren = CUDARenderer(Target("CUDA", "", "sm_90"), use_nvcc=True)
  srcs, planes = {}, QuantWeight.from_raw(random_raw(qtype, 256, 2048, rng).reshape(-1), qtype, 256, 2048, "CPU").planes
  for on in (0, 1):
    monkeypatch.setattr(quant, "TC_PAIRS", on)
    y = tc_product(Tensor.empty(8, 2048, device="CPU"), planes, qtype)
    srcs[on] = "".join(render(c.src[0], ren)[2] for c in y.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK)
  assert str(0x64006400) + "u" in srcs[1] and str(0x64006400) + "u" not in srcs[0] and "__WMMA" in srcs[1]

def test_tc_parts(monkeypatch):
  """Parts of at least TC_PART_LEN (1024), or more, down to 256 long, while the matrix's 64-row warp tiles times the parts
  stay within TC_WARPS (1024, a ceiling): the seeds' shapes (weight rows, columns) -> parts. The 8B's ffn_down keeps 14
  parts (896 warps; 28 gave 1792 and a slower verify step, docs/PERF.md, fifty-second session) where the 1B's goes to 32
  (1024 warps; its batch steps' gain)."""
  assert quant.TC_WARPS == 1024  # the default, unset
  shapes = {(28672, 4096): 4, (4096, 14336): 14, (4096, 4096): 16, (1024, 4096): 16, (6144, 4096): 8, (128256, 4096): 4,  # 8B
            (16384, 2048): 4, (2048, 8192): 32, (3072, 2048): 8, (2048, 2048): 8, (128256, 2048): 2,  # 1B
            (5120, 3072): 12, (8192, 3072): 6, (16384, 3072): 4, (3072, 8192): 16,  # 3B: Q+K+V, gate, gate+up, ffn_down
            (4096, 2048): 8, (12288, 2048): 4, (2048, 6144): 24}  # Qwen3-1.7B: Q+K+V, gate+up, ffn_down
  assert {k: quant.tc_parts(k[1], k[0]) for k in shapes} == shapes
  for (O, K), S in shapes.items():
    ok = [s for s in range(1, K // 256 + 1) if K % s == 0 and (K // s) % 256 == 0]
    base = max([s for s in ok if K // s >= 1024] or [1])
    assert S in ok and S >= base  # whole K-quant blocks a part, and no fewer parts than 1024 long would give
    assert O // 64 * S <= 1024 or S == base  # within the ceiling, unless parts of 1024 already pass it
    assert all(O // 64 * s > 1024 for s in ok if s > S)  # and no more parts stay within it
  monkeypatch.setattr(quant, "TC_WARPS", 512)
  assert [quant.tc_parts(K, O) for O, K in shapes] == [4, 14, 8, 16, 4, 4, 2, 16, 8, 8, 2, 6, 4, 3, 8, 8, 2, 12]
  monkeypatch.setattr(quant, "TC_WARPS", 0)  # parts of 1024 only, as before the knob
  assert [quant.tc_parts(K, O) for O, K in shapes] == [4, 14, 4, 4, 4, 4, 2, 8, 2, 2, 2, 3, 3, 3, 8, 2, 2, 6]

def test_count_knobs():
  """ORIN_LLM_TC_WARPS, ORIN_LLM_TC_MIN_WEIGHTS, ORIN_LLM_TC_PAIRS, ORIN_LLM_AFFINE_MANTISSA: their defaults, a value, and a one-line refusal of anything else."""
  assert (quant.TC_WARPS, quant.TC_MIN_WEIGHTS, quant.TC_PAIRS, quant.AFFINE_MANTISSA) == (1024, 1 << 22, 1, 0)  # unset
  for name, default in (("ORIN_LLM_TC_WARPS", 1024), ("ORIN_LLM_TC_MIN_WEIGHTS", 1 << 22), ("ORIN_LLM_TC_PAIRS", 1), ("ORIN_LLM_AFFINE_MANTISSA", 0)):
    assert quant.count_knob(name, default, 1 << 30, {}) == default and quant.count_knob(name, default, 1 << 30, {name: " 0 "}) == 0
    for bad in ("-1", "many", "1e6", str((1 << 30) + 1)):
      with pytest.raises(OrinError, match=name): quant.count_knob(name, default, 1 << 30, {name: bad})

def kernels(qtype, O, K, R, tc: bool, rows_first: bool = False):
  """The kernels of an R-row product of a weight (O, K) in the fused form, each optimized for an sm_90 CUDA renderer on
  the CPU: (name, opts) each; with tc, the opts are tinygrad's tensor-core opt alone (Opt(TC, 0, (-1, 0, 1)))."""
  from tinygrad.codegen.opt import Opt, OptOps
  from tinygrad.codegen.opt.postrange import Scheduler
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  ren = CUDARenderer(Target("CUDA", "", "sm_90"), use_nvcc=True)
  planes = quant.empty_planes(qtype, O, K, "CPU")
  if rows_first:  # tc_product's multiply with its operands swapped, the reduction whole
    u, a, b, G = quant.affine(planes, qtype)
    w = u.cast(dtypes.float16) * quant._per_group(a.cast(dtypes.float16), G)
    if b is not None: w = w + quant._per_group(b.cast(dtypes.float16), G)
    y = (Tensor.empty(R, K, dtype=dtypes.float16, device="CPU").unsqueeze(-2) * w).sum(-1, dtype=dtypes.float32)
  else: y = tc_product(Tensor.empty(R, K, device="CPU"), planes, qtype)
  asts = [c.src[0] for c in y.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  out = []
  if tc: asts = [next(a for a in asts if any(u.op is Ops.REDUCE for u in a.toposort()))]  # the product
  for ast in asts:  # (x in float16,) the product (then, in parts, their sum)
    if tc:
      k = Scheduler(ast, ren)
      k.apply_opt(Opt(OptOps.TC, 0, (-1, 0, 1)))  # raises KernelOptError where tensor cores do not apply
      out.append(("tc", [f"{o.op.name}" for o in k.applied_opts]))
    else:
      s = full_rewrite_to_sink(ast, ren)
      out.append((re.sub(r"\x1b\[[0-9;]*m", "", s.arg.name), s.arg.applied_opts))
  return out

@pytest.mark.parametrize("qtype,O,K", [(QT.Q6_K, 2048, 2048), (QT.Q4_K, 2048, 8192)], ids=["Q6_K", "Q4_K"])
def test_one_kernel_with_tensor_cores(qtype, O, K):
  """For 4, 8 and 16 rows the dequantized matrix stays in the product's kernel, whose parts a second kernel adds (a cast
  of the whole matrix made tinygrad write it to memory first, an elementwise kernel of its own); x is written in
  float16 by a small kernel before it (x's size: 2 bytes a row and column). With the weights first in the multiply, the tensor-core opt
  takes the kernel (16 weight rows by 8 input rows); with the rows first it needs padding and is refused."""
  parts = quant.tc_parts(K, O)
  assert parts > 1
  for R in (4, 8, 16):
    ks = kernels(qtype, O, K, R, tc=False)
    # x in float16, the product, then the sum of its parts: no elementwise kernel of the matrix's size
    assert len(ks) == 3 and ks[0][0].startswith("E_") and all(name.startswith("r_") for name, _ in ks[1:]), ks
  assert kernels(qtype, O, K, 8, tc=True) == [("tc", ["TC"])]
  # the rows first in the multiply: they land on the tensor core's 16-wide side, which 8 rows do not fill (no padding
  # at this opt level)
  from tinygrad.codegen.opt import KernelOptError
  with pytest.raises(KernelOptError): kernels(qtype, O, K, 8, tc=True, rows_first=True)

def test_chunk_rows_knob(monkeypatch, rng):
  """quant.TC_CHUNK_ROWS (default MATMUL_ROWS; ORIN_LLM_TC_CHUNK_ROWS): a prefill chunk of at most n rows whose matrix has no float16 copy
  takes the form (each weight read once from its planes) in place of a dequantized float16 scratch; with a copy, or
  more rows, or the knob at 0, the chunk's matrix product as before. The form's result for 32 rows against gguf's
  float64 product; the knob's refusal and its place in the steps file's key."""
  assert quant.TC_CHUNK_ROWS == quant.MATMUL_ROWS  # the default: the small chunk
  with pytest.raises(OrinError, match="ORIN_LLM_TC_CHUNK_ROWS"): quant.count_knob("ORIN_LLM_TC_CHUNK_ROWS", 32, 1 << 16, {"ORIN_LLM_TC_CHUNK_ROWS": "-1"})
  monkeypatch.setattr(quant, "has_tensor_cores", lambda device: device == "CPU")  # as a GPU's renderer would say
  monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", 0)
  calls, real = [], quant.tc_product
  monkeypatch.setattr(quant, "tc_product", lambda x, planes, qtype, m=(): calls.append(x.shape[0]) or real(x, planes, qtype, m))
  O, K, R = 16, 512, quant.MATMUL_ROWS
  for qt in (QT.Q4_K, QT.Q6_K):
    raw = random_raw(qt, O, K, rng)
    qw = QuantWeight.from_raw(raw.reshape(-1), qt, O, K, "CPU")
    x = rng.normal(size=(R, K)).astype(np.float32)
    ref = x.astype(np.float64) @ gguf_dequantize(raw.reshape(O, -1), qt).astype(np.float64).T
    for knob, dense, rows, form in ((0, False, R, False), (R, False, R, True), (R, True, R, False), (R, False, 2 * R, False)):
      monkeypatch.setattr(quant, "TC_CHUNK_ROWS", knob)
      qw.dense = None
      if dense: qw.keep_dense()
      calls.clear()
      xs = np.concatenate([x] * (rows // R))
      y = qw(Tensor(xs, device="CPU")).numpy()
      assert calls == ([rows] if form else []), (qt, knob, dense, rows)
      assert np.abs(y[:R] - ref).max() / np.abs(ref).max() < 3e-3
  from orin_llm import step_cache
  monkeypatch.setattr(quant, "TC_CHUNK_ROWS", 0)
  assert step_cache._opts_env()["ORIN_LLM_TC_CHUNK_ROWS"] == "0"

@pytest.mark.parametrize("pairs", [0, 1])
def test_q6_k_form_takes_consecutive_words(monkeypatch, pairs):
  """Q6_K's 2-bit plane in 16-bit units (quant.py: qh2): the form's product reduces over (words, nibbles) as Q4_K's
  does (with TC_PAIRS, over (words, pairs, a pair's two halves)), so the tensor core's k axis takes 16 consecutive
  words, whose codes load as uint4 and ushort4 vectors. With the plane in 32-bit words the reduction was split into
  (scale words, scales, 2 words, nibbles), the k axis took the scale words, 64 elements apart, and the codes loaded
  one word at a time (docs/PERF.md, thirty-eighth session)."""
  monkeypatch.setattr(quant, "TC_PAIRS", pairs)
  monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
  from mv_opts_bench import matvec_ast
  from render_kernels import render
  from tinygrad.codegen.opt.postrange import Scheduler
  from tinygrad.helpers import Target, TC_OPT
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import AxisType
  monkeypatch.setattr(TC_OPT, "value", 2)
  ren = CUDARenderer(Target("CUDA", "", "sm_90"), use_nvcc=True)
  for warps, part in ((0, 1024), (1024, 256)):  # (parts of 1024; the default's for this 256-row matrix, 256 long)
    monkeypatch.setattr(quant, "TC_WARPS", warps)
    reduces = {}
    for qt in (QT.Q4_K, QT.Q6_K):
      ast = matvec_ast(256, 2048, 8, qt, ren, "tc")  # the product's kernel, its ranges as the opts see them
      k = Scheduler(ast, ren)
      reduces[qt] = [s for s, t in zip(k.full_shape, k.axis_types) if t is AxisType.REDUCE]
    assert reduces[QT.Q6_K] == reduces[QT.Q4_K] == ([part // 8, 4, 2] if pairs else [part // 8, 8]), reduces
  name, opts, src = render(matvec_ast(256, 2048, 8, QT.Q6_K, ren, "tc"), ren)
  assert opts[0].op.name == "TC" and re.search(r"ushort4 val\d+ = ", src) and re.search(r"uint4 val\d+ = ", src), src

@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q5_K, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1], ids=lambda q: q.name)
def test_half_codes(qtype, rng, monkeypatch):
  """quant.half_codes: affine()'s u (codes less the zero point) in float16, equal to affine()'s float32 u cast (the
  form's weights unchanged to the bit); in the product's CUDA source the codes are float16 bit patterns, not float32
  ones converted (one conversion instruction a weight)."""
  O, K = 16, 512
  qw = QuantWeight.from_raw(random_raw(qtype, O, K, rng).reshape(-1), qtype, O, K, "CPU")
  want = quant.affine(qw.planes, qtype)[0].cast(dtypes.float16).numpy()
  got = quant.half_codes(qw.planes, qtype).numpy()
  assert got.dtype == np.float16 and np.array_equal(got, want) and len(np.unique(got)) > 4
  monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
  from render_kernels import render
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  ren = CUDARenderer(Target("CUDA", "", "sm_90"), use_nvcc=True)
  planes = QuantWeight.from_raw(random_raw(qtype, 256, 2048, rng).reshape(-1), qtype, 256, 2048, "CPU").planes
  y = tc_product(Tensor.empty(8, 2048, device="CPU"), planes, qtype)
  asts = [c.src[0] for c in y.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  src = "".join(render(a, ren)[2] for a in asts)  # (Q5_K's form writes W in a kernel of its own first)
  assert "tg_bitcast<half>" in src and "(half)((tg_bitcast<float>(" not in src

def test_the_knob_sets_the_tensor_core_opt_level(monkeypatch):
  """quant.tc_opt_level: with the form on, tinygrad's hand-coded opts take tensor cores for a 4-row product (its several
  reduce axes need level 1, its 4 rows padded to the tensor core's 8 need 2); off, the level stays and they do not."""
  from tinygrad.helpers import TC_OPT
  monkeypatch.setattr(TC_OPT, "value", 0)
  quant.tc_opt_level(0)
  assert TC_OPT.value == 0
  assert not any(o.op.name == "TC" for o in kernels(QT.Q4_K, 2048, 2048, 4, tc=False)[1][1])
  quant.tc_opt_level(4)
  assert TC_OPT.value == 2
  assert kernels(QT.Q4_K, 2048, 2048, 4, tc=False)[1][1][0].op.name == "TC"

def test_the_knob(monkeypatch, tmp_path):
  assert tc_rows({}) == 4 and tc_rows({"ORIN_LLM_TC_ROWS": "0"}) == 0 and tc_rows({"ORIN_LLM_TC_ROWS": "2"}) == 2 and tc_rows({"ORIN_LLM_TC_ROWS": " 8 "}) == 8
  for bad in ("1", str(quant.MATMUL_ROWS), "eight", "-2"):
    with pytest.raises(OrinError, match="ORIN_LLM_TC_ROWS"): tc_rows({"ORIN_LLM_TC_ROWS": bad})
  # a Q4_K weight's product takes the form from TC_ROWS rows on, up to MATMUL_ROWS, if the matrix has TC_MIN_WEIGHTS
  # weights or more; a Q6_K weight's from 4 rows with its codes in pairs (the default: quant.TC_TYPES), from 8 without
  calls = []
  monkeypatch.setattr(quant, "tc_product", lambda x, planes, qtype: calls.append((qtype, x.shape[0])) or Tensor.zeros(x.shape[0], 16))
  rng = np.random.default_rng()
  monkeypatch.setattr(quant, "has_tensor_cores", lambda device: device == "CPU")  # as a GPU's renderer would say
  for floor in (16 * 256, 16 * 256 + 1):
    monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", floor)
    for qt in (QT.Q4_K, QT.Q6_K):
      qw = QuantWeight.from_raw(random_raw(qt, 16, 256, rng).reshape(-1), qt, 16, 256, "CPU")
      for on in (0, 4):
        monkeypatch.setattr(quant, "TC_ROWS", on)
        for R in (1, 3, 4, 8):
          qw(Tensor.empty(R, 256, device="CPU"))
  assert quant.TC_PAIRS == 1 and quant.TC_TYPES == {QT.Q4_K: 0, QT.Q6_K: 4}  # the defaults
  assert calls == [(QT.Q4_K, 4), (QT.Q4_K, 8), (QT.Q6_K, 4), (QT.Q6_K, 8)]  # the 16x256 matrix at the floor, none under it
  # a device whose renderer has no tensor cores (tinygrad's CPU backend) keeps one sum
  monkeypatch.undo()
  monkeypatch.setattr(quant, "tc_product", lambda x, planes, qtype: calls.append((qtype, x.shape[0])) or Tensor.zeros(x.shape[0], 16))
  monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", 0)
  monkeypatch.setattr(quant, "TC_ROWS", 4)
  assert not quant.has_tensor_cores("CPU")
  QuantWeight.from_raw(random_raw(QT.Q4_K, 16, 256, rng).reshape(-1), QT.Q4_K, 16, 256, "CPU")(Tensor.empty(8, 256, device="CPU"))
  assert len(calls) == 4  # none more
  # part of the steps file's key, as in effect
  from orin_llm import step_cache
  keys = {}
  for on in (0, 4):
    monkeypatch.setattr(quant, "TC_ROWS", on)
    keys[on] = step_cache._opts_env()
  assert keys[0]["ORIN_LLM_TC_ROWS"] == "0" and keys[4]["ORIN_LLM_TC_ROWS"] == "4"

@pytest.mark.parametrize("pairs", [0, 1])
def test_a_batch_step_in_the_form(tmp_path, rng, monkeypatch, pairs):
  """ORIN_LLM_TC_ROWS=2: a batch step of 3 sequences (a Q4_K model) runs its Q4_K products in the
  fused tensor-core form (with ORIN_LLM_TC_PAIRS, its codes two to a word); its logits are those of one sum within
  float16's rounding of the weights."""
  monkeypatch.setattr(quant, "TC_PAIRS", pairs)
  from conftest import LLAMA_VOCAB
  from orin_llm.engine import Engine
  from orin_llm.synth import write_model, preset
  V = 2048
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q4_K, LLAMA_VOCAB, seed=int(rng.integers(1 << 31)), vocab_size=V)
  prompts = [rng.integers(0, V, int(n)).tolist() for n in rng.choice(np.arange(3, 30), 3, replace=False)]
  logits, calls = {}, []
  real = quant.tc_product
  monkeypatch.setattr(quant, "tc_product", lambda x, p, q, m=(): calls.append(x.shape[0]) or real(x, p, q, m))
  monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", 0)  # the tiny model's matrices are all under the floor
  monkeypatch.setattr(quant, "has_tensor_cores", lambda device: True)  # the form's arithmetic on the CPU
  for on in (0, 2):
    monkeypatch.setattr(quant, "TC_ROWS", on)
    e = Engine(path, max_context=64, chunk=8, max_batch=4)
    for s, p in enumerate(prompts): e.prefill(s, p)
    e.decode([0, 1, 2], 1)
    logits[on] = e.state.logits[0:3].numpy()
  assert calls and set(calls) <= {2, 3, 4, 8}  # the batch's products (and prefill chunks under MATMUL_ROWS)
  err = float(np.linalg.norm(logits[2] - logits[0]) / np.linalg.norm(logits[0]))
  assert 0 < err < 2e-3  # not the same program (0: the knob did nothing), and float16 weights rounded (~1e-4 seen)

def test_the_ffn_activation_goes_to_the_form_in_float16_only(tmp_path, rng, monkeypatch):
  """A verify step of 8 rows whose ffn_down takes the form: SiLU(gate) * up is computed from gate+up's float32 sums
  straight into the form's float16 input, not written as float32 first (a kernel more a layer; model.Block). With the
  form off (one sum) the float32 buffer stays: each of the product's threads computing it again was compute-bound on
  the H200."""
  from math import prod
  from tinygrad.uop.ops import Ops
  from conftest import LLAMA_VOCAB
  from orin_llm.engine import Engine
  from orin_llm.model import Rows
  from orin_llm.synth import write_model, preset
  shape = preset("tiny-llama")
  path = write_model(tmp_path / "m.gguf", shape, QT.Q4_K, LLAMA_VOCAB, seed=int(rng.integers(1 << 31)), vocab_size=2048)
  monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", 0)  # the tiny model's matrices are all under the floor
  monkeypatch.setattr(quant, "has_tensor_cores", lambda device: True)
  R, F = 8, shape.ffn_dim
  sums = (R * 2 * F, dtypes.float32)  # gate+up's output
  def made_from_sums(on: int, act: tuple) -> int:
    """How many kernels of the verify step write act (elements, dtype) reading gate+up's sums."""
    monkeypatch.setattr(quant, "TC_ROWS", on)
    eng = Engine(path, max_context=64, chunk=8)
    out = eng.model(eng.state.prompt[4:4 + R], Rows((eng.v_pos.bind(4),), R, eng.v_slot.bind(0)), all_rows=True)
    bufs = lambda c: [(prod(b.shape), b.dtype) for b in c.src[1:]]
    calls = [bufs(c) for c in out.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
    return sum(b[0] == act and sums in b[1:] for b in calls)
  assert made_from_sums(4, (R * F, dtypes.float16)) == shape.n_layers  # the form: straight to float16
  assert made_from_sums(0, (R * F, dtypes.float32)) == shape.n_layers  # one sum: the float32 buffer

@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_split_sums(qtype, monkeypatch, rng):
  """quant.SPLIT_SUMS (ORIN_LLM_SPLIT_SUMS, on by default): gate+up in the tensor-core form, each member's parts summed
  apart, so that SiLU(gate) * up adds them in its own kernel: one kernel fewer than the parts' sum written out first,
  the same act as gguf's float64 products give (gate and up in their order); Q+K+V (apart off) as before; the knob in
  the steps file's key."""
  from tinygrad.uop.ops import Ops
  from orin_llm import step_cache
  from orin_llm.model import Fused
  monkeypatch.setattr(quant, "has_tensor_cores", lambda device: device == "CPU")  # as a GPU's renderer would say
  monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", 0)
  F, K, R = 16, 2048, 8
  assert quant.tc_parts(K, 2 * F) > 1  # parts to sum
  raws = [random_raw(qtype, F, K, rng) for _ in range(2)]
  qw = QuantWeight.from_raw(np.concatenate(raws).reshape(-1), qtype, 2 * F, K, "CPU")
  qw.splits = (F, F)
  x = (0.05 * rng.normal(size=(R, K))).astype(np.float32)  # gate's outputs around SiLU's bend (a few units)
  g, u = (x.astype(np.float64) @ gguf_dequantize(r.reshape(F, -1), qtype).astype(np.float64).T for r in raws)
  ref = g / (1 + np.exp(-g)) * u
  fused = Fused({"blk.0.ffn_gate_up.weight": qw}, "blk.0.", "ffn_gate_up")
  kernels = lambda t: sum(c.op is Ops.CALL and c.src[0].op is Ops.SINK for c in t.linear_with_vars()[0].src)
  got = {}
  for knob, apart in ((0, True), (1, True), (1, False)):
    monkeypatch.setattr(quant, "SPLIT_SUMS", knob)
    act = lambda: (lambda gate, up: (gate.silu() * up).contiguous())(*fused(Tensor(x, device="CPU"), apart=apart))
    y = act().numpy()
    got[knob, apart] = kernels(act())  # scheduled only, after the run (scheduled first, the run read zeros)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 3e-3, (knob, apart)
  # x in float16, the product's parts, their sum, SiLU * up; summed apart: the sum inside SiLU * up's kernel
  assert got == {(0, True): 4, (1, True): 3, (1, False): 4}, got
  assert quant.SPLIT_SUMS == 1 and step_cache._opts_env()["ORIN_LLM_SPLIT_SUMS"] == "1"
  assert quant.split_sums({}) == 1 and quant.split_sums({"ORIN_LLM_SPLIT_SUMS": "0"}) == 0  # on unless set to 0
  for bad in ("2", "-1", "yes"):  # 0 or 1, else a one-line refusal naming the knob
    with pytest.raises(OrinError, match="ORIN_LLM_SPLIT_SUMS"): quant.split_sums({"ORIN_LLM_SPLIT_SUMS": bad})
  monkeypatch.setattr(quant, "SPLIT_SUMS", 0)
  assert step_cache._opts_env()["ORIN_LLM_SPLIT_SUMS"] == "0"
