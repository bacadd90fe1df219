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

@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q4_0], ids=lambda q: q.name)
def test_planes_dealt_out_to_lanes_give_the_same_weights(qt, rng, monkeypatch):
  """ORIN_LLM_PLANE_LANES (quant.PLANE_LANES, an experiment): the planes' words stored dealt out to lanes, and viewed
  back in element order on the device, give gguf's weights, rows and products; the stored words are a permutation
  of the plain ones (and not the plain order) wherever a plane is long enough."""
  from orin_llm import quant
  rows, cols = 5, 2048
  raw = random_blocks(rng, qt, rows * cols, float(rng.uniform(0.01, 1.0)))
  plain = repack(raw, qt, rows, cols)
  monkeypatch.setattr(quant, "PLANE_LANES", 8)
  dealt = repack(raw, qt, rows, cols)
  moved = [k for k, p in plain.items() if not np.array_equal(p, dealt[k])]
  assert moved and all(np.array_equal(np.sort(plain[k], axis=1), np.sort(dealt[k], axis=1)) for k in moved), moved
  w = QuantWeight.from_raw(raw, qt, rows, cols, "CPU")
  assert w.lanes == 8
  want = gguf.quants.dequantize(raw.reshape(rows, -1), qt).astype(np.float64)
  np.testing.assert_array_equal(w.weights().numpy(), want.astype(np.float32))
  idx = rng.integers(0, rows, 3)
  np.testing.assert_array_equal(w.rows_of(Tensor(idx.astype(np.int32))).numpy(), want[idx].astype(np.float32))
  x = rng.normal(size=(2, cols))
  y = w(Tensor(x.astype(np.float32))).numpy()
  assert np.linalg.norm(y - x @ want.T) / np.linalg.norm(x @ want.T) < 1e-5

def test_experiment_knobs_take_only_their_values():
  """ORIN_LLM_PREFILL_F16 and ORIN_LLM_PLANE_LANES (experiments): their values parsed, anything else refused with the
  variable's name in a one-line error."""
  from orin_llm.quant import prefill_f16, plane_lanes
  from orin_llm.errors import OrinError
  assert prefill_f16({}) is False and prefill_f16({"ORIN_LLM_PREFILL_F16": "1"}) is True
  assert plane_lanes({}) == 0 and plane_lanes({"ORIN_LLM_PLANE_LANES": "32"}) == 32
  for fn, name, bad in [(prefill_f16, "ORIN_LLM_PREFILL_F16", ("2", "yes", "")), (plane_lanes, "ORIN_LLM_PLANE_LANES", ("1", "24", "512", "-4", "x"))]:
    for v in bad:
      with pytest.raises(OrinError, match=name): fn({name: v})
