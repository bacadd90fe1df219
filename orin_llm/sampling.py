"""Next-token choice on the device: greedy, or sampled with temperature, top-k and top-p.

No sort: the top-k and top-p cut-offs are probability thresholds found by a few rounds of a
32-way search over p = exp(logit - max) in (0, 1], each round one small reduction over the
vocabulary; ties at a threshold are all kept. Sampling among the kept tokens is the Gumbel-max
trick with noise from a counter-based hash of (seed, position, token id): no RNG state, and the
same seed gives the same text.
"""
from __future__ import annotations
from dataclasses import dataclass
from tinygrad import Tensor, UOp, dtypes

@dataclass(frozen=True)
class Sampling:
  temperature: float = 0.0  # <= 0: greedy
  top_k: int = 0            # <= 0: off
  top_p: float = 1.0        # >= 1: off
  seed: int = 0
  @property
  def greedy(self) -> bool: return self.temperature <= 0.0
  def as_list(self) -> list[float]: return [max(self.temperature, 1e-6), float(self.top_k), float(self.top_p), float(self.seed % (1 << 24))]

ROUNDS, WAYS = 4, 32

def _hash(x: Tensor) -> Tensor:
  """A 32-bit integer mixing function (lowbias32): uniform-looking bits from consecutive inputs."""
  x = x ^ (x >> 16); x = x * 0x7FEB352D
  x = x ^ (x >> 15); x = x * 0x846CA68B
  return x ^ (x >> 16)

def uniform(n: int, seed: Tensor, pos: int | UOp) -> Tensor:
  """n floats in (0, 1) from (seed, pos): a pure function of its inputs."""
  idx = Tensor.arange(n, dtype=dtypes.uint32)
  key = seed.cast(dtypes.uint32) * 0x9E3779B9 + Tensor(pos).cast(dtypes.uint32) * 0x85EBCA6B
  bits = _hash(_hash(idx + key) + key)
  return ((bits >> 8).cast(dtypes.float32) + 0.5) * (1.0 / (1 << 24))

def masked(logits: Tensor, words: Tensor) -> Tensor:
  """logits (V,) with every token not allowed by words set to -inf. words (ceil(V/32),) uint32: token i is allowed
  iff bit i % 32 of word i // 32 is set (llguidance's bitmask, copied as is: no unpacking on the host)."""
  bits = (words.reshape(-1, 1) >> Tensor.arange(32, dtype=dtypes.uint32).reshape(1, 32)) & 1
  return (bits.reshape(-1)[:logits.shape[0]] != 0).where(logits, float("-inf"))

def greedy(logits: Tensor) -> Tensor: return logits.argmax().cast(dtypes.int32).reshape(1)

def sample(logits: Tensor, params: Tensor, pos: int | UOp) -> Tensor:
  """logits (V,) float32; params (4,) float32 = [temperature, top_k, top_p, seed] -> (1,) int32."""
  V = logits.shape[0]
  l = logits / params[0]
  p = (l - l.max()).exp()
  k = (params[1] > 0).where(params[1].minimum(V), V)
  target = p.sum() * params[2]
  lo_k, lo_p, width = Tensor(0.0), Tensor(0.0), 1.0
  frac = (Tensor.arange(WAYS) + 1).float() * (1.0 / WAYS)
  for _ in range(ROUNDS):  # each round narrows both thresholds 32-fold
    ck, cp = lo_k + frac * width, lo_p + frac * width  # (WAYS,) candidates
    ok_k = ((p.unsqueeze(0) >= ck.unsqueeze(1)).sum(1) >= k)  # candidates that still keep >= k tokens
    ok_p = ((p.unsqueeze(0) >= cp.unsqueeze(1)).where(p.unsqueeze(0), 0.0).sum(1) >= target)  # ... that keep >= top_p mass
    step = width / WAYS
    lo_k, lo_p, width = lo_k + ok_k.sum().float() * step, lo_p + ok_p.sum().float() * step, step
  t = lo_k.maximum((params[2] < 1.0).where(lo_p, 0.0))
  gumbel = -(-uniform(V, params[3], pos).log()).log()
  return (p >= t).where(l + gumbel, float("-inf")).argmax().cast(dtypes.int32).reshape(1)
