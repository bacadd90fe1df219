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
SAMPLE_GROUP = 32  # groups of the candidates' counts over the vocabulary (reduce_last): short, as WAYS of them run at once

def _hash(x: Tensor) -> Tensor:
  """A 32-bit integer mixing function (lowbias32): uniform-looking bits from consecutive inputs."""
  x = x ^ (x >> 16); x = x * 0x7FEB352D
  x = x ^ (x >> 15); x = x * 0x846CA68B
  return x ^ (x >> 16)

def uniform(n: int, seed: Tensor, pos: Tensor) -> Tensor:
  """(R, n) floats in (0, 1) from each row's (seed, pos), seed and pos (R, 1): a pure function of its inputs."""
  idx = Tensor.arange(n, dtype=dtypes.uint32).reshape(1, n)
  key = seed.cast(dtypes.uint32) * 0x9E3779B9 + pos.cast(dtypes.uint32) * 0x85EBCA6B
  bits = _hash(_hash(idx + key) + key)
  return ((bits >> 8).cast(dtypes.float32) + 0.5) * (1.0 / (1 << 24))

def _rows(logits: Tensor) -> Tensor: return logits.reshape(1, -1) if logits.ndim == 1 else logits

def masked(logits: Tensor, words: Tensor) -> Tensor:
  """logits (V,) or (R, V) with every token not allowed by words set to -inf. words (W,) or (R, W) uint32, W =
  ceil(V/32): token i is allowed iff bit i % 32 of word i // 32 is set (llguidance's bitmask, copied as is: no
  unpacking on the host)."""
  logits, words = _rows(logits), words.reshape(-1, words.shape[-1])
  bits = (words.unsqueeze(-1) >> Tensor.arange(32, dtype=dtypes.uint32).reshape(1, 1, 32)) & 1  # (R, W, 32)
  return (bits.reshape(bits.shape[0], -1)[:, :logits.shape[-1]] != 0).where(logits, float("-inf"))

# tinygrad's argmax over a vocabulary is two reductions (the maximum, then the first index holding it), each split by
# tinygrad into 256 partial results of 501 elements for a 128256-token vocabulary: 64 threads walking 2004 values
# each, ~40 us a kernel (H200, 1B Q6_K, docs/PERF.md twentieth session), four kernels a token in all. argmax_rows
# reduces one unsigned 64-bit key per token (the value's bits as an ordered integer, then the index reversed) in groups
# of ARGMAX_GROUP: a first kernel of many short reductions side by side, a second over the groups' maxima (a multiple
# of 16 of them, so that tinygrad's hand-coded opts give it 16 threads). Unsigned: the maximum starts from 0, where a
# signed one starts from -2**63, a literal that clang warns about on the CPU backend.
ARGMAX_GROUP = 256

def argmax_rows(x: Tensor) -> Tensor:
  """x (R, V) float32 -> (R,) int32: the first index of each row's maximum (numpy's argmax, for finite values and
  -inf; -0.0 ranks below 0.0)."""
  R, V = x.shape
  P = -(-V // (ARGMAX_GROUP * 16)) * ARGMAX_GROUP * 16  # padded with -inf, whose indices rank after the real ones
  bits = x.pad(((0, 0), (0, P - V)), value=float("-inf")).bitcast(dtypes.uint32)
  order = bits ^ ((bits >> 31) * 0x7FFFFFFF + 0x80000000)  # the floats' order: negative floats' bits all flipped
  rev = (P - 1 - Tensor.arange(P, dtype=dtypes.int32)).cast(dtypes.uint64).reshape(1, P)
  key = order.cast(dtypes.uint64) * (1 << 32) + rev  # the larger value, then the smaller index
  best = key.reshape(R, P // ARGMAX_GROUP, ARGMAX_GROUP).max(-1).contiguous().max(-1)
  return (P - 1 - (best & 0xFFFFFFFF).cast(dtypes.int64)).cast(dtypes.int32)

def reduce_last(x: Tensor, op: str, group: int = ARGMAX_GROUP) -> Tensor:
  """x (..., V) -> (...): the maximum ("max") or sum ("sum") over the last axis, in two kernels as argmax_rows
  reduces (groups of `group`, then the groups' results), each written out. tinygrad's own split of the sampled
  choice's reductions over a 128256-token vocabulary walked 501 values a thread, four outputs at a time, and fused
  its second stage into the sum over the candidates that follows, a walk of thousands (docs/PERF.md, twentieth
  session)."""
  V = x.shape[-1]
  P = -(-V // (group * 16)) * group * 16
  x = x.pad(((0, 0),) * (x.ndim - 1) + ((0, P - V),), value=float("-inf") if op == "max" else 0)
  y = x.reshape(*x.shape[:-1], P // group, group)
  y = (y.max(-1) if op == "max" else y.sum(-1)).contiguous()
  return (y.max(-1) if op == "max" else y.sum(-1)).contiguous()

def greedy(logits: Tensor) -> Tensor:
  """logits (V,) or (R, V) -> (R,) int32: each row's most likely token (the first, where several tie)."""
  return argmax_rows(_rows(logits))

def sample(logits: Tensor, params: Tensor, pos) -> Tensor:
  """logits (V,) or (R, V) float32; params (4,) or (R, 4) float32 = [temperature, top_k, top_p, seed] per row; pos:
  each row's position (an int, a bound variable, or an (R,) int tensor) -> (R,) int32. A row whose temperature is
  at most 1e-6 (Sampling.as_list's floor for greedy) takes its most likely token, so one step serves a batch that
  mixes greedy and sampled requests."""
  logits = _rows(logits)
  R, V = logits.shape
  params = params.reshape(-1, 4)
  if not isinstance(pos, Tensor): pos = Tensor(pos)
  pos = pos.reshape(-1, 1)
  temp, top_k, top_p, seed = (params[:, i:i + 1] for i in range(4))  # (R, 1) each
  l = logits / temp
  p = (l - reduce_last(l, "max").unsqueeze(-1)).exp()
  k = (top_k > 0).where(top_k.minimum(V), V)
  target = reduce_last(p, "sum").unsqueeze(-1) * top_p
  lo_k, lo_p, width = Tensor.zeros(R, 1), Tensor.zeros(R, 1), 1.0
  frac = ((Tensor.arange(WAYS) + 1).float() * (1.0 / WAYS)).reshape(1, WAYS)
  pe = p.unsqueeze(1)  # (R, 1, V)
  for _ in range(ROUNDS):  # each round narrows both thresholds 32-fold
    ck, cp = (lo_k + frac * width).unsqueeze(-1), (lo_p + frac * width).unsqueeze(-1)  # (R, WAYS, 1) candidates
    ok_k = reduce_last((pe >= ck).cast(dtypes.int32), "sum", SAMPLE_GROUP) >= k  # candidates that still keep >= k tokens
    ok_p = reduce_last((pe >= cp).where(pe, 0.0), "sum", SAMPLE_GROUP) >= target  # ... that keep >= top_p mass
    step = width / WAYS
    lo_k, lo_p, width = lo_k + ok_k.sum(-1, keepdim=True).float() * step, lo_p + ok_p.sum(-1, keepdim=True).float() * step, step
  t = lo_k.maximum((top_p < 1.0).where(lo_p, 0.0))
  gumbel = -(-uniform(V, seed, pos).log()).log()
  noisy = (temp > 1e-6).where(l + gumbel, l)  # greedy rows: no noise
  return argmax_rows((p >= t).where(noisy, float("-inf")))
