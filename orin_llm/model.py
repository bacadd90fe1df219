"""The LLaMA / Qwen3 decoder, written with tinygrad over quantized weights (orin_llm.quant).

One forward pass takes T tokens at positions start_pos .. start_pos+T-1 (T = 1 when decoding, a
chunk when prefilling), writes their keys and values into the float16 KV cache and returns the
logits of the last position. start_pos (and T for prefill) may be symbolic tinygrad variables, so
that one compiled graph serves every position.

Layout choices that keep the decode step to few kernels:
- Q/K/V are one matrix, gate/up are one matrix (rows concatenated by the loader, when their types match: FUSED);
- each RMSNorm is a scalar factor computed once and applied to the input of the next matvec;
- SiLU(gate) * up is computed once into a buffer that the down projection reads;
- attention reads keys in blocks of a constant size, and its denominator comes out of the product with V.
"""
from __future__ import annotations
import math
import numpy as np
from tinygrad import Tensor, UOp, dtypes
from tinygrad.uop.ops import resolve
from orin_llm.config import ModelConfig
from orin_llm import quant

# Keys are attended in blocks of KV_BLOCK positions: the attention's reductions then run over (blocks, KV_BLOCK)
# with KV_BLOCK a constant that the kernel optimizer can spread over threads. Over the symbolic length
# start_pos+T alone, each thread walked every position in turn (H200, position ~100: the product with V took
# ~16 us a layer, docs/PERF.md). The last block's positions past the query are masked.
KV_BLOCK = 32

def kv_capacity(max_context: int) -> int: return -(-max_context // KV_BLOCK) * KV_BLOCK

def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
  return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * w

def rope_table(cfg: ModelConfig, max_context: int, freq_factors: np.ndarray | None) -> np.ndarray:
  """(max_context, head_dim/2, 2) float32: cos and sin of each position's rotation angles, made in float64."""
  inv = cfg.rope_theta ** -(np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
  if freq_factors is not None: inv = inv / freq_factors.astype(np.float64)
  ang = np.arange(max_context, dtype=np.float64)[:, None] * inv[None, :]
  return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)

def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, neox: bool) -> Tensor:
  """x (T, heads, head_dim); cos, sin (T, 1, head_dim/2). llama pairs (2i, 2i+1), neox pairs (i, i+d/2)."""
  T, H, D = x.shape
  if neox: x0, x1 = x[..., :D // 2], x[..., D // 2:]
  else: x0, x1 = x.reshape(T, H, D // 2, 2)[..., 0], x.reshape(T, H, D // 2, 2)[..., 1]
  y0, y1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
  return y0.cat(y1, dim=-1) if neox else y0.unsqueeze(-1).cat(y1.unsqueeze(-1), dim=-1).reshape(T, H, D)

def softmax_numerator(scores: Tensor, nb, pos: Tensor, qpos: Tensor, scale: float) -> Tensor:
  """exp(s - max) of scores (..., T, KV_BLOCK, nb) over keys 0 .. nb*KV_BLOCK-1, masked to the keys at or before
  each query's position (causal, and the last block's tail); qpos (T, 1) holds the queries' positions."""
  # positions from a table rather than Tensor.arange, whose symbolic length would cost a kernel of its own
  kpos = pos[0:nb * KV_BLOCK].reshape(nb, KV_BLOCK).permute(1, 0)
  scores = (kpos <= qpos.unsqueeze(-1)).where(scores * scale, float("-inf"))
  return (scores - scores.max((-2, -1), keepdim=True)).exp()

# weight matrices of one input that run as one product: name of the fused weight -> the matrices it stacks
FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up": ("ffn_gate", "ffn_up")}

def fused_groups(cfg: ModelConfig, types: dict) -> dict[str, list[str]]:
  """Fused tensor name -> its members' names, for the groups whose members share one type (tensor name -> type):
  the loader stacks their quantized rows on the host, so the device holds each matrix once, in one buffer."""
  out = {}
  for i in range(cfg.n_layers):
    for fused, parts in FUSED.items():
      names = [f"blk.{i}.{m}.weight" for m in parts]
      if len({types[n] for n in names}) == 1: out[f"blk.{i}.{fused}.weight"] = names
  return out

class Fused:
  """Matrices of one input (FUSED[name]) applied as one matvec and split after, where the loader stacked them;
  one by one where their types differ."""
  def __init__(self, w: dict, prefix: str, name: str):
    if (f := w.get(prefix + name + ".weight")) is not None: self.parts, self.sizes = [f], list(f.splits)
    else: self.parts, self.sizes = [w[prefix + m + ".weight"] for m in FUSED[name]], None
  def __call__(self, x: Tensor) -> list[Tensor]:
    if self.sizes: return list(self.parts[0](x).split(self.sizes, dim=-1))
    return [w(x) for w in self.parts]

class Block:
  def __init__(self, cfg: ModelConfig, w: dict, i: int, max_context: int, device: str):
    p = f"blk.{i}."
    self.cfg = cfg
    self.attn_norm, self.ffn_norm = w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"]
    self.qkv = Fused(w, p, "attn_qkv")
    self.wo, self.down = w[p + "attn_output.weight"], w[p + "ffn_down.weight"]
    self.gate_up = Fused(w, p, "ffn_gate_up")
    if cfg.qk_norm: self.q_norm, self.k_norm = w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"]
    # zeros, not empty: masked positions of the last block are read (and multiplied by 0), so they must be finite
    self.cache = Tensor.zeros(2, cfg.n_kv_heads, kv_capacity(max_context), cfg.head_dim, dtype=dtypes.float16, device=device).contiguous().realize()

  def attention(self, x: Tensor, start_pos: int | UOp, rope: Tensor, pos: Tensor) -> Tensor:
    c, T = self.cfg, x.shape[0]
    q, k, v = self.qkv(rms_norm(x, self.attn_norm, c.norm_eps))
    q, k, v = q.reshape(T, c.n_heads, c.head_dim), k.reshape(T, c.n_kv_heads, c.head_dim), v.reshape(T, c.n_kv_heads, c.head_dim)
    if c.qk_norm: q, k = rms_norm(q, self.q_norm, c.norm_eps), rms_norm(k, self.k_norm, c.norm_eps)
    cos, sin = rope[start_pos:start_pos + T, :, 0].unsqueeze(1), rope[start_pos:start_pos + T, :, 1].unsqueeze(1)
    q, k = apply_rope(q, cos, sin, c.rope_neox), apply_rope(k, cos, sin, c.rope_neox)
    # write this chunk's keys and values into the cache, then attend over everything up to it
    new = Tensor.stack(k, v).permute(0, 2, 1, 3).cast(dtypes.float16)  # (2, kv_heads, T, head_dim)
    # a store into the cache buffer that the reads below are ordered after (as tinygrad's own llm does it): a graph
    # edge, not a kernel; Tensor.assign on the slice would leave the store pending outside this step's graph
    cache = Tensor(self.cache.uop.after(self.cache[:, :, start_pos:start_pos + T, :].uop.store(new.uop)))
    nb = (start_pos + T + KV_BLOCK - 1) // KV_BLOCK  # blocks holding keys 0 .. start_pos+T-1
    g = c.n_heads // c.n_kv_heads
    q = q.reshape(T, c.n_kv_heads, g, c.head_dim).permute(1, 2, 0, 3)  # (kv_heads, g, T, head_dim)
    qpos = pos[start_pos:start_pos + T].reshape(T, 1)
    attend = self.attend_chunk if quant.as_matrix(T) else self.attend_rows
    out = attend(q, cache, nb, pos, qpos, 1.0 / math.sqrt(c.head_dim))  # (kv_heads, g, T, head_dim)
    return self.wo(out.permute(2, 0, 1, 3).reshape(T, c.n_heads * c.head_dim))

  # Both attention forms divide by the softmax's denominator after the product with V, which exp(s - max) feeds.

  def attend_rows(self, q: Tensor, cache: Tensor, nb, pos: Tensor, qpos: Tensor, scale: float) -> Tensor:
    """Few query rows (decode): the reductions over keys run over (KV_BLOCK, nb), the probabilities are never
    written out, and the denominator comes out of the product with V as a column of ones appended to V."""
    c = self.cfg
    T = q.shape[2]
    # (kv_heads, KV_BLOCK, nb, head_dim): the symbolic block count inside, so that tinygrad keeps it apart from the
    # constant KV_BLOCK axis (merged, they make one symbolic range that no thread split applies to)
    blocked = lambda kv: kv[:, 0:nb * KV_BLOCK, :].reshape(c.n_kv_heads, nb, KV_BLOCK, c.head_dim).permute(0, 2, 1, 3).float()
    keys, vals = blocked(cache[0]), blocked(cache[1])
    # (kv_heads, g, T, KV_BLOCK, nb)
    scores = (q.unsqueeze(-2).unsqueeze(-2) * keys.unsqueeze(1).unsqueeze(1)).sum(-1)
    e = softmax_numerator(scores, nb, pos, qpos, scale)
    vals1 = vals.pad(((0, 0), (0, 0), (0, 0), (0, 1)), value=1.0).reshape(c.n_kv_heads, 1, 1, KV_BLOCK, nb, c.head_dim + 1)
    acc = (e.unsqueeze(-1) * vals1).sum((-3, -2))  # (kv_heads, g, T, head_dim + 1)
    return acc[..., :c.head_dim] / acc[..., c.head_dim:]

  def attend_chunk(self, q: Tensor, cache: Tensor, nb, pos: Tensor, qpos: Tensor, scale: float) -> Tensor:
    """A prefill chunk: the scores and the product with V as float16 products with float32 sums (the product
    with V runs on tensor cores), the scores and probabilities each written once: fused as in attend_rows,
    every output column recomputed each exp (H200, a chunk of 512: 3.4 ms a layer, docs/PERF.md). They take
    6 bytes per head, row and key, sized by the JIT for the longest context: 453 MB for a 1B's chunk of 512
    at context 4096."""
    kv, g, T, D = q.shape
    L = nb * KV_BLOCK
    q16 = q.reshape(kv, g * T, 1, 1, D).cast(dtypes.float16).contiguous()
    # scores (kv_heads, g*T, KV_BLOCK, nb): the keys' symbolic length split into a constant axis that tensor cores
    # can take and the block count kept apart from it (as in attend_rows). Over one symbolic axis the product had
    # no tensor cores and took a third of a chunk's time (8.7 ms of 26.6 at 512 rows, H200, docs/PERF.md)
    keys = cache[0][:, 0:L, :].reshape(kv, 1, nb, KV_BLOCK, D).permute(0, 1, 3, 2, 4)
    scores = (q16 * keys).sum(-1, dtype=dtypes.float32).reshape(kv, g, T, KV_BLOCK, nb)
    e = softmax_numerator(scores, nb, pos, qpos, scale)
    # probabilities written in key order, float16: the product with V is then one matrix product over the keys
    p16 = e.permute(0, 1, 2, 4, 3).reshape(kv, g * T, L).cast(dtypes.float16).contiguous()
    out = p16.matmul(cache[1][:, 0:L, :], dtype=dtypes.float32).reshape(kv, g, T, D)
    return out / p16.float().sum(-1).reshape(kv, g, T, 1)

  def __call__(self, x: Tensor, start_pos: int | UOp, rope: Tensor, pos: Tensor) -> Tensor:
    h = x + self.attention(x, start_pos, rope, pos)
    gate, up = self.gate_up(rms_norm(h, self.ffn_norm, self.cfg.norm_eps))
    # SiLU(gate) * up computed once into a buffer: inside the down projection every thread's rows recomputed it
    # (an exp and a reciprocal per element and row group, which made that matvec compute-bound on the H200)
    return h + self.down((gate.silu() * up).contiguous())

class Transformer:
  def __init__(self, cfg: ModelConfig, w: dict, max_context: int, device: str, pad: int = 0):
    """pad: rows of cache and position tables past max_context, for padded prefill chunks that start near its end."""
    self.cfg, self.max_context = cfg, max_context
    max_context += pad
    self.embd, self.output_norm = w["token_embd.weight"], w["output_norm.weight"]
    self.output = w["token_embd.weight"] if cfg.tied_output else w["output.weight"]
    ff = w["rope_freqs.weight"].numpy() if cfg.rope_freq_factors else None
    self.rope = Tensor(rope_table(cfg, max_context, ff), device=device).realize()
    self.pos = Tensor(np.arange(kv_capacity(max_context), dtype=np.int32), device=device).realize()  # position of each cache row
    self.blocks = [Block(cfg, w, i, max_context, device) for i in range(cfg.n_layers)]

  def __call__(self, tokens: Tensor, start_pos: int | UOp, n: int | UOp | None = None) -> Tensor:
    """tokens (T,) int32 at positions start_pos.. -> float32 logits (vocab,) of the n-th (default: the last).
    With n < T the tokens after the n-th are padding: their keys and values land in the cache past the
    sequence, where nothing reads them before the position is written again."""
    x = self.embd.rows_of(tokens)
    for b in self.blocks: x = b(x, start_pos, self.rope, self.pos)
    last = x[-1:] if n is None else x[n - 1:n]
    return self.output(rms_norm(last, self.output_norm, self.cfg.norm_eps))[0]
