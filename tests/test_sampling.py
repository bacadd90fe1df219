"""Sampling on the device against numpy: the empirical distribution of sampled tokens matches
softmax(logits / T) restricted to the top-k / top-p set, a seed repeats its choices, and greedy is argmax."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, dtypes
from orin_llm.sampling import Sampling, sample, greedy

def allowed_probs(logits, t, k, p):
  """The reference: softmax(l/t) over the k most likely tokens, cut to the smallest set with mass >= p."""
  z = logits / t
  q = np.exp(z - z.max()); q /= q.sum()
  order = np.argsort(-q)
  keep = np.zeros(len(q), bool)
  if k > 0: keep[order[:k]] = True
  else: keep[:] = True
  if p < 1:
    csum = np.cumsum(q[order])
    nucleus = np.zeros(len(q), bool); nucleus[order[:int(np.searchsorted(csum, p) + 1)]] = True
    keep &= nucleus
  out = np.where(keep, q, 0)
  return out / out.sum()

def draw(logits, s: Sampling, n: int):
  lg = Tensor(logits.astype(np.float32)).realize()
  params = Tensor(s.as_list(), dtype=dtypes.float32).contiguous().realize()
  v = UOp.variable("pos", 0, 1 << 20)
  step = TinyJit(lambda pos: sample(lg, params, pos).realize())
  return np.array([step(v.bind(i)).item() for i in range(n)])

@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 4, 0.6)])
def test_distribution_matches_reference(t, k, p, rng):
  logits = rng.normal(0, 1.5, 12)
  n = 3000
  got = draw(logits, Sampling(t, k, p, seed=int(rng.integers(1 << 20))), n)
  want = allowed_probs(logits, t, k, p)
  freq = np.bincount(got, minlength=len(logits)) / n
  assert (freq[want == 0] == 0).all(), (freq, want)  # never outside the top-k / top-p set
  tol = 4 * np.sqrt(want * (1 - want) / n) + 2e-3
  assert (np.abs(freq - want) <= tol).all(), (freq, want)

def test_seed_repeats_and_top_k_1_is_greedy(rng):
  logits = rng.normal(0, 1, 50)
  a = draw(logits, Sampling(1.0, 0, 1.0, seed=7), 40)
  b = draw(logits, Sampling(1.0, 0, 1.0, seed=7), 40)
  c = draw(logits, Sampling(1.0, 0, 1.0, seed=8), 40)
  assert (a == b).all() and (a != c).any()
  assert (draw(logits, Sampling(2.0, 1, 1.0, seed=3), 10) == np.argmax(logits)).all()
  assert greedy(Tensor(logits.astype(np.float32))).item() == np.argmax(logits)

@pytest.mark.parametrize("R", [1, 3])
def test_greedy_is_numpys_argmax_first_of_ties(R, rng):
  """argmax_rows' packed keys (value order, then the index reversed) against numpy's argmax: vocabularies that are and
  are not multiples of its groups, ties (the first index wins), -inf entries, a row of nothing but -inf."""
  for V in (int(rng.integers(2, 300)), 4096, int(rng.integers(4097, 140000))):
    x = rng.normal(0, 4, (R, V)).astype(np.float32)
    x[:, rng.integers(V, size=max(1, V // 10))] = -np.inf
    for r in range(R):  # a tie for the maximum at two random places
      a, b = sorted(rng.choice(V, 2, replace=False))
      x[r, a] = x[r, b] = np.abs(x[r][np.isfinite(x[r])]).max() + 1
    if R > 1: x[-1] = -np.inf
    got = greedy(Tensor(x)).numpy()
    assert (got == np.argmax(x, -1)).all(), (V, got, np.argmax(x, -1))
  neg = -np.abs(rng.normal(0, 3, (R, 1000))).astype(np.float32)  # all negative: their bits order the other way
  assert (greedy(Tensor(neg)).numpy() == np.argmax(neg, -1)).all()

def test_greedy_is_two_kernels_of_short_reductions():
  """The mechanism (docs/PERF.md, twentieth session): tinygrad's argmax of a 128256-token row was four kernels, two of
  them 256 partial reductions of 501 values each; argmax_rows is two, each reducing at most ARGMAX_GROUP values per
  output."""
  from tinygrad.uop.ops import Ops
  from orin_llm.sampling import ARGMAX_GROUP
  calls = [c for c in greedy(Tensor.empty(1, 128256)).linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  assert len(calls) == 2, [c.src[0].arg for c in calls]
  out_sizes = [c.src[1].shape[0] for c in calls]  # each kernel's output buffer: 512 group maxima, then 1
  assert out_sizes == [-(-128256 // (ARGMAX_GROUP * 16)) * 16, 1], out_sizes
