"""Every tensor type, dequantized on the device from its planes, equals gguf.quants.dequantize of the
same blocks (fresh random blocks each run); the fused matvec equals a float64 product."""
import numpy as np
import pytest
import gguf
from gguf import GGMLQuantizationType as QT
from orin_llm.quant import QuantWeight, SUPPORTED, repack
from orin_llm.synth import random_blocks
from tinygrad import Tensor

@pytest.mark.parametrize("qt", SUPPORTED, ids=lambda q: q.name)
def test_dequantize_equals_gguf(qt, rng):
  rows, cols = 6, 768  # three K-quant super-blocks, 24 blocks of 32 per row
  raw = random_blocks(rng, qt, rows * cols, float(rng.uniform(0.01, 1.0)))
  want = gguf.quants.dequantize(raw.reshape(rows, -1), qt).astype(np.float64)
  w = QuantWeight.from_raw(raw, qt, rows, cols, "CPU")
  got = w.weights().numpy()
  assert np.isfinite(got).all() and np.abs(want).max() > 0
  np.testing.assert_array_equal(got, want.astype(np.float32))  # exact: float32 arithmetic on exact values
  x = rng.normal(size=(3, cols))
  y = w(Tensor(x.astype(np.float32))).numpy()
  ref = x @ want.T
  assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5

@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.F16], ids=lambda q: q.name)
def test_embedding_rows(qt, rng):
  rows, cols = 40, 512
  raw = random_blocks(rng, qt, rows * cols)
  want = gguf.quants.dequantize(raw.reshape(rows, -1), qt)
  idx = rng.integers(0, rows, 7)
  got = QuantWeight.from_raw(raw, qt, rows, cols, "CPU").rows_of(Tensor(idx.astype(np.int32))).numpy()
  np.testing.assert_array_equal(got, want[idx].astype(np.float32))

def test_planes_take_about_the_file_size(rng):
  for qt in SUPPORTED:
    raw = random_blocks(rng, qt, 4 * 1024)
    planes = repack(raw, qt, 4, 1024)
    ratio = sum(p.nbytes for p in planes.values()) / raw.nbytes
    assert ratio <= 1.04, (qt.name, ratio)  # K-quants widen their 6-bit scales to 8 bits: +3%


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1])
def test_affine_product_matches_gguf(qtype, rng):
  """quant.affine_product (each group's scale taken out of its sum; ORIN_LLM_AFFINE) against gguf's own dequantization
  in float64, on fresh random blocks with finite scales and a fresh random input."""
  from gguf import GGML_QUANT_SIZES
  from gguf.quants import dequantize as gguf_dequantize
  from orin_llm.quant import QuantWeight, affine_product
  O, K, R = 8, 512, 3
  block, bsize = GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, size=(O * K // block, bsize), dtype=np.uint8)
  halves = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q4_1: (0, 2), QT.Q5_1: (0, 2), QT.Q6_K: (bsize - 2, 1)}.get(qtype, (0, 1))
  raw[:, halves[0]:halves[0] + 2 * halves[1]] = rng.uniform(1e-3, 1e-2, size=(raw.shape[0], halves[1])).astype(np.float16).view(np.uint8)
  x = rng.normal(size=(R, K)).astype(np.float32)
  qw = QuantWeight.from_raw(raw.reshape(-1), qtype, O, K, "CPU")
  y = affine_product(Tensor(x, device="CPU"), qw.planes, qtype).numpy()
  ref = x.astype(np.float64) @ gguf_dequantize(raw.reshape(O, -1), qtype).astype(np.float64).T
  assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-5

@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q4_0, QT.Q4_1])
def test_mantissa_product_matches_gguf(qtype, rng, monkeypatch):
  """ORIN_LLM_AFFINE_MANTISSA=1: quant.mantissa_codes gives 1 + code / 16 exactly (affine()'s u plus its zero point,
  over 16), and mantissa_product equals gguf's float64 product within 1e-5 of the output's scale (its sums subtract
  (16 + zero) * sum(x) once a group: ~1e-6 seen); a QuantWeight's one-row product takes it with the knob on only."""
  from gguf import GGML_QUANT_SIZES
  from gguf.quants import dequantize as gguf_dequantize
  from orin_llm import quant
  O, K, R = 8, 512, int(rng.integers(1, 4))
  block, bsize = GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, size=(O * K // block, bsize), dtype=np.uint8)
  halves = {QT.Q4_K: (0, 2), QT.Q4_1: (0, 2)}.get(qtype, (0, 1))
  raw[:, halves[0]:halves[0] + 2 * halves[1]] = rng.uniform(1e-3, 1e-2, size=(raw.shape[0], halves[1])).astype(np.float16).view(np.uint8)
  qw = QuantWeight.from_raw(raw.reshape(-1), qtype, O, K, "CPU")
  f, bits = quant.mantissa_codes(qw.planes, qtype)
  u = quant.affine(qw.planes, qtype)[0].numpy()
  assert bits == 4 and np.array_equal((f.numpy().astype(np.float64) - 1) * 16 - quant._AFFINE_ZERO.get(qtype, 0), u)
  assert len(np.unique(u)) == 16
  x = rng.normal(size=(R, K)).astype(np.float32)
  ref = x.astype(np.float64) @ gguf_dequantize(raw.reshape(O, -1), qtype).astype(np.float64).T
  y = quant.mantissa_product(Tensor(x, device="CPU"), qw.planes, qtype).numpy()
  assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-5
  calls = []
  real = quant.mantissa_product
  monkeypatch.setattr(quant, "mantissa_product", lambda *a: calls.append(1) or real(*a))
  monkeypatch.setattr(quant, "AFFINE", (qtype,))
  for on in (0, 1):
    monkeypatch.setattr(quant, "AFFINE_MANTISSA", on)
    qw(Tensor(x[:1], device="CPU"))
  assert calls == [1]

def test_affine_types_from_the_environment():
  """ORIN_LLM_AFFINE: 1 the default types, 0 none, else type names; anything else is refused with the choices named."""
  from orin_llm.errors import OrinError
  from orin_llm.quant import AFFINE_DEFAULT, affine_types
  assert affine_types({}) == affine_types({"ORIN_LLM_AFFINE": "1"}) == AFFINE_DEFAULT and affine_types({"ORIN_LLM_AFFINE": "0"}) == ()
  assert affine_types({"ORIN_LLM_AFFINE": " q6_k, Q4_K,Q6_K "}) == (QT.Q6_K, QT.Q4_K)
  for bad in ("off", "Q6_K,F16", ",", "Q3_K"):
    with pytest.raises(OrinError, match="ORIN_LLM_AFFINE.*Q4_K"): affine_types({"ORIN_LLM_AFFINE": bad})
