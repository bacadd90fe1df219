"""The LLaMA / Qwen3 decoder, written with tinygrad over quantized weights (orin_llm.quant).

One forward pass runs the tokens of `Rows`: one sequence's T consecutive tokens from its start position (a prefill
chunk, a speculative verify step, or T = 1 when decoding alone), or B sequences of T tokens each, sequence b in
KV-cache slot b (a batched decode step, T = 1, or several prompts prefilled together). It writes their keys and values into the float16 KV cache
and returns logits. Start positions (and the slot of a single sequence) may be symbolic tinygrad variables, so
that one compiled graph serves every position.

The KV cache of a layer is position-major, (capacity, slots, 2, kv_heads, head_dim): the context length then
enters the kernels only as a buffer size and a variable's bound, never as a stride, so the kernels the BEAM
search tuned for one context serve another (the search's cache key ignores sizes and bounds: tinygrad patch).
The bounds must stay within the buffers' rows: past them tinygrad wraps a position by a modulo of the capacity
(step_cache.steps_reach).

Layout choices that keep the decode step to few kernels:
- Q/K/V are one matrix, gate/up are one matrix (rows concatenated by the loader, when their types match: FUSED);
- each RMSNorm is a scalar factor computed once and applied to the input of the next matvec;
- SiLU(gate) * up is computed once into a buffer that the down projection reads;
- attention reads keys in blocks of a constant size, and its denominator comes out of the product with V.
"""
from __future__ import annotations
import math, os
from dataclasses import dataclass
import numpy as np
from tinygrad import Tensor, UOp, dtypes
from orin_llm.config import ModelConfig
from orin_llm.errors import OrinError
from orin_llm import quant

# Keys are attended in blocks, and only the block count is symbolic: a reduction over a symbolic range runs serially
# in each thread, one memory latency a step, so the steps a thread walks must grow slowly with the context.
# A prefill chunk's scores take blocks of KV_BLOCK keys, a constant axis for the tensor cores (attend_chunk).
# Decode and verify rows take blocks of ROW_BLOCK keys, each split into SEGMENTS interleaved segments of SEGMENT keys
# (flash-decoding's split, attend_rows): a thread reduces its segment's keys (a constant count, unrolled) in each block
# in turn, and a second reduction over the constant segment axis combines the segments' maxima and sums. Left to the
# kernel optimizer instead (a GROUP over 256 key lanes), a bounded BEAM search did not find the split: 120 us a layer
# (H100, docs/PERF.md). Long blocks cost their masked tail: up to ROW_BLOCK-1 keys read and thrown away, every step.
KV_BLOCK = 256
# Blocks of 1024 keys in 128 segments of 8: at depth 4096 a thread walks 4 blocks, not the 16 of 256-key blocks in 32
# segments, and the depth's cost per token fell from 0.48 to 0.20 ms (1B Q6_K, H100; llama.cpp's: 0.14), decode at
# depth 4096 0.68x -> 0.78x llama.cpp, depth 0 unchanged (thirteenth session, docs/PERF.md). The cost: a step reads up
# to 1023 masked keys (the 1B: 33 MB a token at most, 3% of its weights). Blocks of 1024 (64 x 16) and 512 (32 x 16)
# had decoded slower (sixth session, their kernels barely searched). ORIN_LLM_DECODE_SEGMENTS=n (an experiment's knob;
# part of the steps file's key): n segments of 8 keys
# The new keys and values of a step over several sequences (batched decode, prompts prefilled together), each at its own
# position: one store per sequence is a kernel per sequence and layer (the 1B's 4-row step: 383 kernels against one row's
# 224, 48 of them such stores; docs/PERF.md, forty-third session). So one store, whose target is the sequences' slices
# concatenated (rangeify makes it one kernel over the B rows, choosing each row's offset; tinygrad patch 0048 lets it
# compile): the 1B Q6_K's 4-row step 1.744 -> 1.686 ms, 8 rows 2.115 -> 1.910, one row unchanged (H200, forty-fifth
# session). ORIN_LLM_ONE_STORE=0 (an experiment's knob; part of the steps file's key): a store per sequence.
ONE_STORE = quant.count_knob("ORIN_LLM_ONE_STORE", 1, 1)

def decode_segments(env=os.environ) -> int:
  """ORIN_LLM_DECODE_SEGMENTS: a whole number from 1 to 1024 (default 128)."""
  raw = env.get("ORIN_LLM_DECODE_SEGMENTS", "128")
  if not raw.strip().isdigit() or not 1 <= int(raw) <= 1024:
    raise OrinError(f"ORIN_LLM_DECODE_SEGMENTS={raw!r}: a whole number of segments from 1 to 1024 is needed (default 128)")
  return int(raw)
SEGMENTS, SEGMENT = decode_segments(), 8
ROW_BLOCK = SEGMENTS * SEGMENT
# Where every row of a decode step attends to few keys, 1024-key blocks are mostly masked: at depth 16-32 the 1B Q6_K's
# 4-row attention cost 2.44x one row's (243 against 100 us a step), and with 256-key blocks (32 segments) the 4-row step
# took 1.685 -> 1.534 ms, one row 1.073 -> 1.044, but one row's decode at depth 4096 812.6 -> 691.4 tok/s (H200,
# forty-sixth session, docs/PERF.md). So decode and batch steps are compiled in both block sizes, and a round whose rows
# all attend to fewer than SHORT_KEYS keys runs the steps of SHORT_BLOCK keys (Engine.decode). ORIN_LLM_SHORT_KEYS=n
# (a whole number; 0: never; part of the steps file's key, since the warm-up captures the short steps only where they run)
SHORT_BLOCK = 32 * SEGMENT

def short_keys(env=os.environ) -> int:
  """ORIN_LLM_SHORT_KEYS: a whole number of keys from 0 (off) to 1 << 24 (past any context; default 512)."""
  return quant.count_knob("ORIN_LLM_SHORT_KEYS", 512, 1 << 24, env)
SHORT_KEYS = short_keys() if SHORT_BLOCK < ROW_BLOCK else 0
# The segments' partial sums take (query rows x SEGMENTS x row_columns) floats a layer: 3.3 MB for a verify step of 8
# rows of the 1B, but 168 MB for 4 prompts of 32 rows prefilled together (Steps.group). Rows past ROW_SEGMENT_BUDGET /
# SEGMENTS take fewer, longer segments, so that a step's partial sums stay what 8 rows' are (each thread then walks
# more keys of a block, as a prefill chunk's rows are many enough to keep the GPU busy without the split)
# (an experiment's knob ORIN_LLM_ROW_SEGMENT_BUDGET, thirty-seventh session, made verify steps of 8 rows cheaper with a
# smaller budget and batch steps dearer by up to 23%; removed once the verify rows took the matrix form: docs/PERF.md)
ROW_SEGMENT_BUDGET = 8 * SEGMENTS

def row_segments(rows: int, block: int = ROW_BLOCK) -> int:
  """Segments of a key block of `block` keys for this many query rows (per head): block / SEGMENT up to 8 rows (decode,
  batches of up to 8, verify steps), then the most that divide that (a block's keys split evenly) with rows x segments
  within the budget (ROW_SEGMENT_BUDGET, in proportion to the block): halved for each doubling of the rows where it is a
  power of two."""
  most = block // SEGMENT
  return max([s for s in range(1, most + 1) if most % s == 0 and rows * s * SEGMENTS <= ROW_SEGMENT_BUDGET * most] or [1])
# the score of a masked key: finite, so that a segment with no visible key (its maximum this value) gives exp(0) = 1
# for its keys, sums of finite values, which its weight exp(MASKED - max) = 0 then removes; -inf would give NaN there
MASKED = -1e30

# A prefill chunk's product with V walks every key in each output tile: few tiles (the 1B's chunk of 512: 768 warps of
# one a block with the hand-coded opts), each waiting on a load per step, so its time grew with the context (139 us a
# layer at position 1536, H200, eighteenth session). The keys of each block are split into PV_PARTS runs, multiplied
# side by side (one more axis of tiles) into float32 partial sums that the division adds: the split is taken inside
# each KV_BLOCK (a constant), so no block is added to the symbolic count and no masked key is computed.
# ORIN_LLM_CHUNK_PV_PARTS=n (an experiment's knob; part of the steps file's key): 1 is no split
def chunk_pv_parts(env=os.environ) -> int:
  """ORIN_LLM_CHUNK_PV_PARTS: a divisor of KV_BLOCK whose runs are a multiple of 16 keys (default 4)."""
  raw = env.get("ORIN_LLM_CHUNK_PV_PARTS", "4")
  if not raw.strip().isdigit() or not 1 <= int(raw) <= KV_BLOCK // 16 or (KV_BLOCK // int(raw)) % 16:
    raise OrinError(f"ORIN_LLM_CHUNK_PV_PARTS={raw!r}: a divisor of {KV_BLOCK} that leaves runs of a multiple of 16 keys is needed (default 4)")
  return int(raw)
PV_PARTS = chunk_pv_parts()

# The matrix form's scores of fewer query rows than a tensor core's 8 columns (a verify step of 4 rows: T = 4) had no
# tensor core: the heads of a group (g) and the rows (T) are two axes of 4, neither of 8, and tinygrad's TC opt takes
# one axis a side (rendered for sm_90 from a one-layer 1B file, thirty-eighth session). There the 1B Q6_K's verify of 4
# rows at depth 4000 cost 17% more than in the rows' split (H200, docs/PERF.md). Merged into one axis of g*T rows the
# product takes a tensor core, if the mask (which needs each row's position: the merged index modulo T, which tinygrad
# splits back into two ranges) is applied after the scores are written, in the two kernels that read them.
# ORIN_LLM_MERGED_SCORES_ROWS=n (an experiment's knob; part of the steps file's key; default 0, off): query rows per
# sequence under which the scores are merged so
def merged_scores_rows(env=os.environ) -> int:
  """ORIN_LLM_MERGED_SCORES_ROWS: a whole number, 0 (default, off) or the rows per sequence under which it applies."""
  raw = env.get("ORIN_LLM_MERGED_SCORES_ROWS", "0")
  if not raw.strip().isdigit():
    raise OrinError(f"ORIN_LLM_MERGED_SCORES_ROWS={raw!r}: a whole number of rows is needed (default 0, off)")
  return int(raw)
MERGED_SCORES_ROWS = merged_scores_rows()

def kv_capacity(max_context: int) -> int:
  """Rows of the KV cache: the context rounded up to whole blocks of either form."""
  b = math.lcm(KV_BLOCK, ROW_BLOCK, SHORT_BLOCK)
  return -(-max_context // b) * b

def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
  return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * w

def rope_table(cfg: ModelConfig, max_context: int, freq_factors: np.ndarray | None) -> np.ndarray:
  """(max_context, head_dim/2, 2) float32: cos and sin of each position's rotation angles, made in float64."""
  inv = cfg.rope_theta ** -(np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
  if freq_factors is not None: inv = inv / freq_factors.astype(np.float64)
  ang = np.arange(max_context, dtype=np.float64)[:, None] * inv[None, :]
  return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)

def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, neox: bool) -> Tensor:
  """x (N, heads, head_dim); cos, sin (N, 1, head_dim/2). llama pairs (2i, 2i+1), neox pairs (i, i+d/2)."""
  N, H, D = x.shape
  if neox:
    # x * (cos, cos) + (x1, x0) * (-sin, sin): the halves swapped are a view of x, so the result is one expression.
    # Computed as two halves and concatenated (y0.cat(y1)), each half of Qwen3's rotated queries was a kernel of its own
    # (28 kernels a decode step; H200, eighteenth session, docs/PERF.md)
    h = D // 2
    return x * cos.cat(cos, dim=-1) + x[..., h:].cat(x[..., :h], dim=-1) * (-sin).cat(sin, dim=-1)
  x0, x1 = x.reshape(N, H, D // 2, 2)[..., 0], x.reshape(N, H, D // 2, 2)[..., 1]
  y0, y1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
  return y0.unsqueeze(-1).cat(y1.unsqueeze(-1), dim=-1).reshape(N, H, D)

# Query rows of one sequence from which they attend in the matrix form (attend_chunk: float16 products on tensor cores over
# blocks of KV_BLOCK keys), not the rows' split (attend_rows: ROW_BLOCK keys, SEGMENTS segments a block, each row's partial
# sums kept apart). A verify step's rows share their keys as a prompt chunk's do; in the rows' split each row re-reads
# them and writes SEGMENTS partial sums: 2.5 ms of the 8B's 8-row verify step (23%). In the matrix form (H200, BEAM=0,
# thirty-eighth session, docs/PERF.md) the 8B's verify steps of 8 rows took 26-27% less at depths 64 and 4000, of 4 rows
# 11-18% less; the 1B Q6_K's of 8 rows 10-17% less, of 4 rows the same at depth 64 and 17% more at 4000 (the one loss).
# On the CPU backend its prefill chunks of NO_TC_CHUNK rows take it too. Several sequences' rows together (batches,
# Steps.group) keep their rule.
# ORIN_LLM_ATTN_MATRIX_ROWS=n (part of the steps file's key) moves the bound: 32 (quant.MATMUL_ROWS) is the rule before.
DEFAULT_ATTN_MATRIX_ROWS = 4
def attn_matrix_rows(env=os.environ) -> int:
  """ORIN_LLM_ATTN_MATRIX_ROWS: a whole number from 2 (default DEFAULT_ATTN_MATRIX_ROWS)."""
  raw = env.get("ORIN_LLM_ATTN_MATRIX_ROWS", str(DEFAULT_ATTN_MATRIX_ROWS))
  if not raw.strip().isdigit() or int(raw) < 2:
    raise OrinError(f"ORIN_LLM_ATTN_MATRIX_ROWS={raw!r}: a whole number from 2 is needed (default {DEFAULT_ATTN_MATRIX_ROWS})")
  return int(raw)
ATTN_MATRIX_ROWS = attn_matrix_rows()

def attends_as_matrix(T: int, B: int = 1) -> bool:
  """Whether T query rows per sequence of B sequences take a prefill chunk's matrix form (attend_chunk): from
  quant.MATMUL_ROWS rows (from ATTN_MATRIX_ROWS of a lone sequence: a verify step's), or of several sequences' prompts side by side (T > 1:
  decode and batches of decode rows keep the rows' split, attend_rows, however many sequences)."""
  return (isinstance(T, int) and B == 1 and T >= ATTN_MATRIX_ROWS) or quant.as_matrix(T) or (isinstance(T, int) and T > 1 and quant.as_matrix(B * T))

def key_block(T: int, B: int = 1, row_block: int = ROW_BLOCK) -> int:
  """Keys per block of the attention form that T query rows per sequence of B sequences take: the matrix form's
  (attends_as_matrix), else the rows' split's (row_block: ROW_BLOCK, or SHORT_BLOCK in a short step)."""
  return KV_BLOCK if attends_as_matrix(T, B) else row_block

@dataclass(frozen=True)
class Rows:
  """The tokens of one forward pass. starts[b]: the first position of sequence b (an int or a bound variable).
  T tokens per sequence. slot: a lone sequence's KV-cache slot (int or bound variable); B > 1 sequences are in
  slots 0..B-1. nb: key blocks every row attends over (None: those the one sequence needs); with several sequences
  it is a variable bound to what the longest needs, in blocks of key_block(T, B, row_block). row_block: keys per
  block of the rows' split (ROW_BLOCK; SHORT_BLOCK in the steps of short contexts)."""
  starts: tuple
  T: int = 1
  slot: int | UOp = 0
  nb: int | UOp | None = None
  row_block: int = ROW_BLOCK
  @property
  def B(self) -> int: return len(self.starts)
  def blocks(self, size: int):
    """Blocks of `size` keys that hold every key the rows attend to (nb, where given, counts blocks of key_block(T, B, row_block))."""
    if self.nb is not None: assert size == key_block(self.T, self.B, self.row_block); return self.nb
    return (self.starts[0] + self.T + size - 1) // size
  def gather(self, table: Tensor) -> Tensor:
    """table[start_b + t] for every row, (B*T, ...): a slice per sequence at its symbolic start."""
    parts = [table[s:s + self.T] for s in self.starts]
    return parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:])

# columns of ones after V's in a prefill chunk's product with the probabilities (attend_chunk): its sums are the
# softmax's denominator; a multiple of 8, so that the product stays on tensor cores
DENOM_COLUMNS = 8

def row_columns(head_dim: int) -> int:
  """Columns of V with ones appended in decode and verify rows' product (attend_rows): the fewest above head_dim that
  are a multiple of 16 and not of 3 (80 for 64, 160 for 128). tinygrad's hand-coded opts then give each thread 4
  consecutive columns (a multiple of 3 gets 3: three 2-byte loads rather than one 8-byte load) and put 4 or 8 threads
  side by side along them, so that a warp reads whole 32-byte sectors of V's rows (CUDA source rendered on the CPU)."""
  c = head_dim + 1
  while c % 16 or c % 3 == 0: c += 1
  return c

def softmax_numerator(scores: Tensor, nb, pos: Tensor, qpos: Tensor, scale: float) -> Tensor:
  """exp(s - max) of scores (nb, ..., KV_BLOCK) over keys 0 .. nb*KV_BLOCK-1, the block count first, masked to the
  keys at or before each query's position (causal, and the last block's tail); qpos broadcasts against scores' middle
  axes."""
  # positions from a table rather than Tensor.arange, whose symbolic length would cost a kernel of its own
  kpos = pos.reshape(-1, KV_BLOCK)[0:nb].reshape(nb, *[1] * (scores.ndim - 2), KV_BLOCK)
  scores = (kpos <= qpos).where(scores * scale, float("-inf"))
  return (scores - scores.max((0, -1), keepdim=True)).exp()

# weight matrices of one input that run as one product: name of the fused weight -> the matrices it stacks
FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up": ("ffn_gate", "ffn_up")}

def runs_of(members: tuple[str, ...], qtype) -> list[tuple[str, ...]]:
  """members split into runs of consecutive matrices of one type (qtype: member -> type), in order."""
  out: list[tuple[str, ...]] = []
  for m in members:
    if out and qtype(out[-1][-1]) == qtype(m): out[-1] += (m,)
    else: out.append((m,))
  return out

def run_name(fused: str, run: tuple[str, ...]) -> str:
  """The name a run of FUSED[fused]'s members is loaded under: the fused name when it holds all of them, else its
  members' names joined by '+' (attn_q+attn_k, where attn_v has another type; a lone member keeps its own)."""
  return fused if run == FUSED[fused] else "+".join(run)

def fused_groups(cfg: ModelConfig, types: dict) -> dict[str, list[str]]:
  """Fused tensor name -> its members' names: each run of a FUSED group's members that share one type (tensor name ->
  type), where it holds two or more. The loader stacks their quantized rows on the host, so the device holds each run
  once, in one buffer. llama-quantize's Q4_K_M gives attn_v (and ffn_down) Q6_K in some layers and Q4_K in others:
  there Q and K still run as one product, V as another (three products before)."""
  out = {}
  for i in range(cfg.n_layers):
    for fused, parts in FUSED.items():
      for run in runs_of(parts, lambda m: types[f"blk.{i}.{m}.weight"]):
        if len(run) > 1: out[f"blk.{i}.{run_name(fused, run)}.weight"] = [f"blk.{i}.{m}.weight" for m in run]
  return out

class Fused:
  """Matrices of one input (FUSED[name]) applied as few products as the loader stacked them into (fused_groups), the
  outputs split after, in the members' order."""
  def __init__(self, w: dict, prefix: str, name: str):
    members, self.parts = FUSED[name], []
    while members:  # the longest run of the members left that was loaded as one weight (a lone member: its own name)
      n = next(n for n in range(len(members), 0, -1) if prefix + run_name(name, members[:n]) + ".weight" in w)
      self.parts.append(w[prefix + run_name(name, members[:n]) + ".weight"])
      members = members[n:]
  def __call__(self, x: Tensor, apart: bool = False) -> list[Tensor]:
    """apart: with quant.SPLIT_SUMS, the tensor-core form sums each member's parts apart, for a next kernel that reads
    each member's outputs once (SiLU(gate) * up). Not Q+K+V: the query's and key's rotation read each output twice,
    and tinygrad wrote their sums in kernels of their own (rendered for sm_90: 3 kernels became 4)."""
    out = []
    for wt in self.parts:
      if apart and quant.SPLIT_SUMS and wt.splits and wt.tc_form(x): out += wt.members(x); continue
      y = wt(x)
      # a part of several in the affine form gets a kernel of its own: alone (Q4_K_M's Q6_K attn_v beside attn_q+attn_k),
      # tinygrad fused it into the kernel storing the keys and values, which tinygrad's heuristic (patch 0039) does not lay
      # out: one thread a weight row, the 8B Q4_K_M's decode 17% slower (docs/PERF.md, twenty-seventh session)
      if len(self.parts) > 1 and wt.affine(x): y = y.contiguous()
      out += y.split(list(wt.splits), dim=-1) if wt.splits else [y]
    return out

class Block:
  def __init__(self, cfg: ModelConfig, w: dict, i: int, capacity: int, slots: int, device: str):
    p = f"blk.{i}."
    self.cfg = cfg
    self.attn_norm, self.ffn_norm = w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"]
    self.qkv = Fused(w, p, "attn_qkv")
    self.wo, self.down = w[p + "attn_output.weight"], w[p + "ffn_down.weight"]
    self.gate_up = Fused(w, p, "ffn_gate_up")
    if cfg.qk_norm: self.q_norm, self.k_norm = w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"]
    # zeros, not empty: masked positions of the last block are read (and multiplied by 0), so they must be finite
    self.cache = Tensor.zeros(capacity, slots, 2, cfg.n_kv_heads, cfg.head_dim, dtype=dtypes.float16, device=device).contiguous().realize()

  def attention(self, x: Tensor, rows: Rows, rope: Tensor, pos: Tensor) -> Tensor:
    c, B, T = self.cfg, rows.B, rows.T
    N = B * T
    q, k, v = self.qkv(rms_norm(x, self.attn_norm, c.norm_eps))
    q, k, v = q.reshape(N, c.n_heads, c.head_dim), k.reshape(N, c.n_kv_heads, c.head_dim), v.reshape(N, c.n_kv_heads, c.head_dim)
    if c.qk_norm:
      # every head's RMSNorm factor in one reduction over the queries and keys side by side (one buffer where Q and K are
      # one product, as in every layer of the seeds' files); a norm each took a kernel each (Qwen3: 28 kernels a step)
      f = (q.cat(k, dim=1).square().mean(-1, keepdim=True) + c.norm_eps).rsqrt()  # (N, heads + kv_heads, 1)
      q, k = q * f[:, :c.n_heads] * self.q_norm, k * f[:, c.n_heads:] * self.k_norm
    rp = rows.gather(rope)  # (N, head_dim/2, 2)
    cos, sin = rp[:, :, 0].unsqueeze(1), rp[:, :, 1].unsqueeze(1)
    q, k = apply_rope(q, cos, sin, c.rope_neox), apply_rope(k, cos, sin, c.rope_neox)
    # write the new keys and values into the cache, then attend over everything up to them. Each store is ordered
    # before the reads below (AFTER, as tinygrad's own llm does it): a graph edge, not a kernel; Tensor.assign on the
    # slice would leave the store pending outside this step's graph. One store per sequence: each at its own start.
    new = Tensor.stack(k, v, dim=1).cast(dtypes.float16).reshape(B, T, 1, 2, c.n_kv_heads, c.head_dim)
    slot0 = rows.slot if B == 1 else 0
    if B > 1 and ONE_STORE:  # one store for all: its target the sequences' slices side by side (tinygrad patch 0048)
      views = [self.cache[s:s + T, b:b + 1] for b, s in enumerate(rows.starts)]
      stores = [views[0].cat(*views[1:], dim=1).uop.store(new.reshape(B, T, 2, c.n_kv_heads, c.head_dim).permute(1, 0, 2, 3, 4).uop)]
    else: stores = [self.cache[s:s + T, slot0 + b:slot0 + b + 1].uop.store(new[b].uop) for b, s in enumerate(rows.starts)]
    cache = Tensor(self.cache.uop.after(*stores))
    # prefill chunks (of one sequence, or several sequences' prompts together): the tensor-core form; decode, batch and
    # verify rows: the split over the keys. Each query carries its own sequence and position. Several prompts of 32
    # rows in the rows' form took 150 us a layer at position 100, their scores 327 us a layer at the prewarm's context
    # (1B, H200, docs/PERF.md twenty-second session)
    matrix = attends_as_matrix(T, B)
    size = key_block(T, B, rows.row_block)
    nb = rows.blocks(size)
    # (nb, size, B, 2, kv_heads, head_dim): the whole cache in blocks, then the first nb blocks. Sliced first
    # (nb * size rows) and split into blocks after, every load's index took a modulo by the symbolic length
    # (CUDA source rendered on the CPU: 8 integer divisions by a runtime value per step of the decode's
    # segment sums, tests/test_attention.py)
    kv = cache.reshape(-1, size, *cache.shape[1:])[0:nb, :, slot0:slot0 + B]
    g = c.n_heads // c.n_kv_heads
    q = q.reshape(B, T, c.n_kv_heads, g, c.head_dim).permute(0, 2, 3, 1, 4)  # (B, kv_heads, g, T, head_dim)
    qpos = rows.gather(pos).reshape(B, T)
    scale = 1.0 / math.sqrt(c.head_dim)
    if matrix: out = self.attend_chunk(q, kv, nb, pos, qpos, scale)
    else: out = self.attend_rows(q, kv, nb, pos, qpos, scale)  # (B, kv_heads, g, T, head_dim)
    return self.wo(out.permute(0, 3, 1, 2, 4).reshape(N, c.n_heads * c.head_dim))

  # Both attention forms divide by the softmax's denominator after the product with V, which exp(s - max) feeds.

  # kv: (nb, block, B, 2, kv_heads, head_dim), the first nb blocks of the B sequences' cache slots

  def attend_rows(self, q: Tensor, kv: Tensor, nb, pos: Tensor, qpos: Tensor, scale: float) -> Tensor:
    """Few query rows (decode, verify): split over the keys as flash-decoding does. Per segment of keys (key
    (j * SEGMENTS + s) * KB + k is key k of segment s in block j, KB = SEGMENT): the maximum, and the
    exp-weighted sum of V with columns of ones appended (row_columns), which gives the softmax's denominator; then the segments
    are combined, each weighted by exp(its max - the overall max). The probabilities are never written out."""
    B, KV, g, T, D = q.shape
    block = kv.shape[1]  # ROW_BLOCK, or SHORT_BLOCK in a short step
    S = row_segments(B * T, block)
    KB = block // S
    # (nb, B, kv_heads, S, KB, head_dim): the symbolic block count and the keys of a segment (both reduced) kept apart
    # by the segment axis, so that tinygrad cannot merge them into one symbolic range, which it runs serially. The
    # block count first in every buffer the scores are written to: the context then enters it only as its size, not
    # in the other axes' strides, and a kernel searched at one context serves another (tinygrad patch 0009). Laid out
    # (B, KV, g, T, nb, S, KB), the scores, maxima and segment sums of every decode and verify step had other search
    # keys at another context, and the segment sums divided by nb twice per step (tests/test_cache.py, test_attention.py)
    blocked = lambda t: t.reshape(nb, S, KB, B, KV, D).permute(0, 3, 4, 1, 2, 5).float()
    keys, vals = blocked(kv[:, :, :, 0]), blocked(kv[:, :, :, 1])
    scores = (q.reshape(1, B, KV, g, T, 1, 1, D) * keys.reshape(nb, B, KV, 1, 1, S, KB, D)).sum(-1)  # (nb, B, KV, g, T, S, KB)
    kpos = pos.reshape(-1, S, KB)[0:nb].reshape(nb, 1, 1, 1, 1, S, KB)
    scores = (kpos <= qpos.reshape(1, B, 1, 1, T, 1, 1)).where(scores * scale, MASKED)
    m = scores.max((0, -1), keepdim=True)  # (1, B, KV, g, T, S, 1): each segment's maximum
    C = row_columns(D)
    vals1 = vals.pad(((0, 0), (0, 0), (0, 0), (0, 0), (0, 0), (0, C - D)), value=1.0).reshape(nb, B, KV, 1, 1, S, KB, C)
    # written out, so that the segments stay apart: as one expression with the combination below, tinygrad fused both
    # into one reduction over every key (a few thousand threads walking the whole context: 1263 us a layer for the 8B's
    # head_dim 128 at depth 4000 with hand-coded opts; 47 us split, H100, docs/PERF.md). The columns first in that
    # buffer, so that the threads side by side in a warp take consecutive columns of V (the first axis is the first
    # thread axis); laid out (B, KV, g, T, S, D + 1), a warp's 32 threads read one 2-byte value of V each from 32 rows
    # or heads, and each column was its own thread block: every 32-byte sector of V fetched 16 times (1B: 32.1 us a
    # layer timed alone at depth 4000, H100, eighth session; V's 4 MB take ~1.5 us at the copy bandwidth)
    part = ((scores - m).exp().unsqueeze(-1) * vals1).sum((0, -2)).permute(5, 0, 1, 2, 3, 4).contiguous()  # (C, B, KV, g, T, S)
    m = m.reshape(B, KV, g, T, S)
    acc = (part * (m - m.max(-1, keepdim=True)).exp()).sum(-1).permute(1, 2, 3, 4, 0)  # (B, KV, g, T, C)
    return acc[..., :D] / acc[..., D:D + 1]

  def attend_chunk(self, q: Tensor, kv: Tensor, nb, pos: Tensor, qpos: Tensor, scale: float) -> Tensor:
    """A prefill chunk (of one sequence, or of several sequences' prompts side by side): the scores and the product
    with V as float16 products with float32 sums (the product with V runs on tensor cores), the scores and probabilities each written once: fused as in
    attend_rows, every output column recomputed each exp (H200, a chunk of 512: 3.4 ms a layer, docs/PERF.md).
    They take 6 bytes per head, row and key, sized by the JIT for the longest context: 453 MB for a 1B's chunk of
    512 at context 4096."""
    B, KV, g, T, D = q.shape
    # scores (nb, kv_heads, g, T, KV_BLOCK): the keys' symbolic length split into the block count and a constant axis
    # that tensor cores can take (over one symbolic axis the product had none: 8.7 ms of a 26.6 ms chunk of 512 rows,
    # H200, docs/PERF.md), in key order, so that a tile's outputs are stored in vectors along the keys. Every axis in
    # place before the product, no reshape of it after: the block count is an expression of start_pos here, and
    # reshaping the scores (then laid out (KV, g*T, KV_BLOCK, nb)) made every load's index a division by it that
    # mentioned every range, so no tensor core applied and each output float was stored alone (CUDA source rendered
    # on the CPU, tests/test_attention.py): 9.0 ms with the hand-coded opts for the 1B's 512-row chunk at mid context,
    # 1.36 ms after a 60 s search (H100, ninth session). The block count first in the scores' and probabilities'
    # buffers, as attend_rows has it: the JIT sizes those buffers for the largest block count, so laid out
    # (KV, g, T, nb, KV_BLOCK) their strides held it, and the chunk's four attention kernels had other search keys
    # at another context (the scores and the product with V were the prewarm's longest searches, 60 s each: issue 25)
    # Several sequences (their prompts prefilled together, Steps.group): B an outer axis of every buffer, each
    # sequence's queries against its own slot's keys; for one, that axis is 1 and the kernels are a lone chunk's
    merged = isinstance(T, int) and T < MERGED_SCORES_ROWS  # one axis of g*T rows, the scores written before the mask
    rows = (g * T,) if merged else (g, T)
    q16 = q.reshape(1, B, KV, *rows, 1, D).cast(dtypes.float16).contiguous()
    keys = kv[:, :, :, 0].permute(0, 2, 3, 1, 4).reshape(nb, B, KV, *[1] * len(rows), KV_BLOCK, D)
    scores = (q16 * keys).sum(-1, dtype=dtypes.float32)  # (nb, B, KV, *rows, KV_BLOCK)
    if merged: scores = scores.contiguous().reshape(nb, B, KV, g, T, KV_BLOCK)
    e = softmax_numerator(scores, nb, pos, qpos.reshape(1, B, 1, 1, T, 1), scale)
    # probabilities written in key order, float16, then products with V over the keys (PV_PARTS of them, each over its
    # runs of keys): the buffer's block count and keys of a run seen as one axis (a view, no copy), since the
    # hand-coded opts try tensor cores only on a kernel with one reduce axis (summed over both, the product had none). V's columns padded with ones give the
    # denominator too (as attend_rows does), rather than a kernel of its own reading the probabilities again. Eight of
    # them: with one column more (65) the product had no tensor cores
    # Split in PV_PARTS runs of R keys inside each block (key j * KV_BLOCK + s * R + r in part s): each part's keys
    # one axis again (block count and r), the parts an axis of their own, their float32 sums written out (contiguous:
    # else tinygrad folds the parts' sum back into the product's reduction) and added after
    S, R = PV_PARTS, KV_BLOCK // PV_PARTS
    p16 = e.cast(dtypes.float16).contiguous().reshape(nb, B, KV, g, T, S, R).permute(5, 1, 2, 3, 4, 0, 6).reshape(S, B, KV, g * T, nb * R)
    vals1 = kv[:, :, :, 1].reshape(nb, S, R, B, KV, D).permute(1, 3, 4, 0, 2, 5).reshape(S, B, KV, nb * R, D)
    vals1 = vals1.pad(((0, 0), (0, 0), (0, 0), (0, 0), (0, DENOM_COLUMNS)), value=1.0)
    acc = p16.matmul(vals1, dtype=dtypes.float32)
    # the parts added as S slices, not a sum over an axis: a reduction is a kernel of its own that writes the sums out
    # for the division to read again (20 us a layer in the 1B's chunk of 512, H200); added, they are read in the kernel
    # that divides, which also writes the float16 input of the output projection
    acc = acc.contiguous() if S > 1 else acc
    acc = sum((acc[s] for s in range(1, S)), acc[0]).reshape(B, KV, g, T, D + DENOM_COLUMNS)
    return acc[..., :D] / acc[..., D:D + 1]

  def __call__(self, x: Tensor, rows: Rows, rope: Tensor, pos: Tensor) -> Tensor:
    h = x + self.attention(x, rows, rope, pos)
    gate, up = self.gate_up(rms_norm(h, self.ffn_norm, self.cfg.norm_eps), apart=True)
    # SiLU(gate) * up computed once into a buffer: inside the down projection every thread's rows recomputed it
    # (an exp and a reciprocal per element and row group, which made that matvec compute-bound on the H200). A prefill
    # chunk's product makes its float16 input itself (quant: the matrix form), here computed in that same kernel: written
    # out as float32 first, a second kernel cast it (37.6 us a layer in the 1B's chunk of 512, H200, docs/PERF.md).
    # The tensor-core form of a few rows (quant.tc_product) writes its float16 input in a kernel of its own too: there
    # the buffer of act in float32 was a kernel more a layer (32 more in the 8B's verify step; CPU render, forty-first session)
    act = gate.silu() * up
    return h + self.down(act if quant.as_matrix(act.shape[0]) or self.down.tc(act) else act.contiguous())

class Transformer:
  def __init__(self, cfg: ModelConfig, w: dict, max_context: int, device: str, pad: int = 0, slots: int = 1):
    """pad: rows of cache and position tables past max_context, for padded prefill chunks that start near its end.
    slots: sequences the KV cache holds at once."""
    self.cfg, self.max_context, self.slots = cfg, max_context, slots
    self.capacity = kv_capacity(max_context + pad)
    self.embd, self.output_norm = w["token_embd.weight"], w["output_norm.weight"]
    self.output = w["token_embd.weight"] if cfg.tied_output else w["output.weight"]
    ff = w["rope_freqs.weight"].numpy() if cfg.rope_freq_factors else None
    self.rope = Tensor(rope_table(cfg, self.capacity, ff), device=device).realize()
    self.pos = Tensor(np.arange(self.capacity, dtype=np.int32), device=device).realize()  # position of each cache row
    self.blocks = [Block(cfg, w, i, self.capacity, slots, device) for i in range(cfg.n_layers)]

  def __call__(self, tokens: Tensor, rows: Rows, n=None, all_rows: bool = False) -> Tensor:
    """tokens (B*T,) int32 -> float32 logits (R, vocab): of every row (all_rows, or B > 1 sequences of T = 1), else
    of each sequence's n-th row (n: an int or variable, or a tuple of them, one per sequence; default: the last).
    With n < T the tokens after the n-th are padding: their keys and values land in the cache past the sequence,
    where nothing reads them before the position is written again."""
    x = self.embd.rows_of(tokens)
    for b in self.blocks: x = b(x, rows, self.rope, self.pos)
    if not all_rows and (rows.B == 1 or rows.T > 1):
      ns = n if isinstance(n, tuple) else (rows.T if n is None else n,) * rows.B
      picks = [x[b * rows.T + k - 1:b * rows.T + k] for b, k in enumerate(ns)]
      x = picks[0].cat(*picks[1:]) if len(picks) > 1 else picks[0]
    return self.output(rms_norm(x, self.output_norm, self.cfg.norm_eps))
