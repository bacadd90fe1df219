"""The engine: a loaded model, its run state on the device (RunState) and the compiled steps that advance it.

The KV cache holds `slots` sequences. Callers drive it push-style, as llama.cpp's server does with its slots:
- `prefill(slot, tokens)` runs the part of a prompt the slot has not cached, chunk by chunk (`prefill_chunks`
  yields between chunks, so a scheduler can interleave other slots' decode steps or stop a cancelled prompt);
- `prefill_together({slot: tokens})` runs up to `group_rows` prompt tokens of each of several slots in one step
  (clients that arrive together: their prompts' weights read once, not once per prompt);
- `decode(slots, n)` advances several slots together, n tokens each, in batched steps queued back to back;
- `generate(...)` is the single-sequence loop built on both (CLI, bench, tests).
Constrained decoding (structured.py) masks a slot's choices with its row of `mask`: `prefill_chunks(mask=)` and
`decode(masks=)` take the bitmasks from a callback called once the model step is queued, so the host computes
them while the device runs it; `generate(constraint=)` drives a structured.Constraint.

Tokens live on the device. A model step writes logits; a choice step (greedy or sampled, kept apart so that both
share the model's graphs) picks a token per row and writes it to `next_tok[slot]`, which the next decode step
reads as its input, and to `hist[i, slot]`, where the host reads the tokens of i = 0..n-1 queued steps at once
(`lookahead`). The only things that change between replays of a compiled step are symbolic variables: positions,
the slot, the chunk's valid length, the history row.
"""
from __future__ import annotations
import functools, os, time
from dataclasses import dataclass, field
from typing import Iterator
import numpy as np
from tinygrad import Tensor, TinyJit, UOp, dtypes, Device
from tinygrad.helpers import Context, GlobalCounters
from orin_llm.errors import OrinError
from orin_llm.loader import open_model, load_weights
from orin_llm.model import Transformer, Rows, fused_groups, key_block, ROW_BLOCK, SHORT_BLOCK, SHORT_KEYS
from orin_llm.step_cache import steps_reach
from orin_llm.sampling import Sampling, greedy, masked, sample
from orin_llm.hostio import host_io
from orin_llm import log, quant, settings

DEFAULT_CONTEXT = 4096
# prompt tokens per prefill step. On a GPU, chunks run the weights as float16 matrix products on tensor cores
# (quant.MATMUL_ROWS). A chunk of 512 rows took 28.2 ms, one of 32 rows 6.2 ms (H100, 1B Q6_K, docs/PERF.md, sixth
# session): prompts, and the tail of a long one, of at most SMALL_CHUNK_MAX tokens run in chunks of SMALL_CHUNK rows,
# so that time to first token grows with the prompt. Where the device has no tensor cores to feed (tinygrad's CPU
# backend), chunks of NO_TC_CHUNK rows, below MATMUL_ROWS: their weights are dequantized inside the product, as decode's.
DEFAULT_CHUNK, NO_TC_CHUNK, SMALL_CHUNK, SMALL_CHUNK_MAX = 512, 16, 32, 128
# decode steps queued before the host reads their tokens: the host needs ~0.3 ms to queue a step (H200, docs/PERF.md),
# which overlaps the device's work only while steps are queued; 8 tokens arrive together (~13 ms at 600 tok/s)
DEFAULT_LOOKAHEAD = 8
HIST = 16  # rows of the token history: the most decode steps queued at once (and verify rows)
VERIFY_SIZES = (4, 8)  # rows of the compiled verify steps (speculative decoding): a verify runs in the smallest that holds it
BATCH_SIZES = (2, 4, 8)  # decode steps compiled for several sequences: a batch runs in the smallest that holds it

def group_rows(tensor_cores: bool, slots: int, env=os.environ) -> int:
  """Prompt tokens per sequence of the step that prefills every slot's prompt at once (Steps.group): a small chunk
  each where tensor cores take the products of all the rows; else so few that the rows stay under
  quant.MATMUL_ROWS, whose products dequantize inside the reduction as decode's do (tinygrad's CPU backend).
  ORIN_LLM_GROUP_ROWS=n (an experiment's knob; part of the steps file's key), with tensor cores: n in place of
  SMALL_CHUNK, e.g. 16 for clients' short prompts (the load bench's 16 tokens ran padded to 32 rows each: 4 prompts'
  step 5.3 ms against 3.1 for one, H200, docs/PERF.md twenty-second session); the rows take the matrix form together
  (model.attends_as_matrix) from quant.MATMUL_ROWS rows in all."""
  if not tensor_cores: return max(1, NO_TC_CHUNK // slots)
  raw = env.get("ORIN_LLM_GROUP_ROWS", str(SMALL_CHUNK)).strip()
  if not raw.isdigit() or not 2 <= int(raw) <= SMALL_CHUNK_MAX:
    raise OrinError(f"ORIN_LLM_GROUP_ROWS={raw!r}: a whole number of rows from 2 to {SMALL_CHUNK_MAX} is needed (default {SMALL_CHUNK})")
  return int(raw)

@dataclass
class Slot:
  """Host-side state of one KV-cache slot: the tokens whose keys and values it holds, from position 0."""
  cached: list[int] = field(default_factory=list)
  next: int | None = None  # the token chosen last, the input of the slot's next decode step (not cached yet)
  sampling: Sampling | None = None

class RunState:
  """Everything a step reads or writes besides the weights, with its shape (llama2.c's RunState):
  per layer the KV cache (capacity, slots, 2, kv_heads, head_dim) float16, in the model's blocks;
  prompt   (capacity,) int32       the prompt being prefilled (one at a time)
  group    (slots, G) int32        G prompt tokens of each slot, prefilled together (Steps.group; G = group_rows)
  next_tok (slots,) int32          each slot's next input token: every choice writes it, decode reads it
  hist     (HIST, slots) int32     the tokens chosen by the queued steps, by step index (verify: by row)
  params   (slots, 4) float32      each slot's sampling parameters (sampling.Sampling.as_list)
  mask     (slots, words) uint32   each slot's allowed tokens, a bit each (words = vocab/32 rounded up), read only by
                                   the masked choice steps; all ones but for slots of constrained requests
  logits   (rows, vocab) float32   the last model step's logits, rows = max(slots, HIST)"""
  def __init__(self, capacity: int, slots: int, vocab: int, device: str, group: int = 1):
    z = lambda *shape, dtype=dtypes.int32: Tensor.zeros(*shape, dtype=dtype, device=device).contiguous().realize()
    self.prompt, self.next_tok, self.hist = z(capacity), z(slots), z(HIST, slots)
    self.group = z(slots, group)
    self.params = Tensor(np.array([Sampling().as_list()] * slots, np.float32), device=device).contiguous().realize()
    self.logits = z(max(slots, HIST), vocab, dtype=dtypes.float32)
    self.mask = Tensor.full((slots, (vocab + 31) // 32), 0xFFFFFFFF, dtype=dtypes.uint32, device=device).contiguous().realize()

class Engine:
  def __init__(self, path, max_context: int | None = None, device: str | None = None, chunk: int | None = None,
               kernel_db=None, max_batch: int = 1, reach: bool = False, prefill_copy_mb: int = quant.DEFAULT_PREFILL_COPY_MB):
    """chunk: the largest prefill chunk (default: DEFAULT_CHUNK with tensor cores, else NO_TC_CHUNK). max_batch: slots,
    the sequences the KV cache holds and a decode step can advance together. kernel_db: the model file opened and its
    kernel database chosen by kernel_cache.prepare (where the process starts): the repacked planes and the captured
    steps are kept beside that database; None: neither, tinygrad uses $CACHEDB. reach: steps valid up to
    steps_reach(max_context), with buffers of that capacity (a prewarm's engine). prefill_copy_mb: MiB of device memory
    the layers' matrices may take as float16 copies, which prefill chunks then multiply (quant.DEFAULT_PREFILL_COPY_MB;
    0: none): kept where all of them fit, else none."""
    t0 = time.monotonic()
    self.file, self.cfg = (kernel_db.file, kernel_db.cfg) if kernel_db is not None else open_model(path)
    self.path, self.device = path, device or Device.DEFAULT
    self.max_context = min(self.cfg.context_length, max_context or DEFAULT_CONTEXT)
    if max_batch < 1: raise OrinError(f"max_batch must be at least 1, not {max_batch}")
    tc = quant.has_tensor_cores(self.device)  # the same test as the few-row products' tensor-core form
    if chunk is None: chunk = DEFAULT_CHUNK if tc else NO_TC_CHUNK
    self.chunk = min(chunk, self.max_context)
    # chunk sizes a prompt runs in: the largest, and small ones for short prompts where the largest is a matrix step
    self.chunks = sorted({self.chunk} | ({min(SMALL_CHUNK, self.chunk)} if self.chunk > SMALL_CHUNK else set()))
    self.kernel_db = kernel_db.db if kernel_db is not None else None
    self.weights = load_weights(self.file, self.cfg, self.device, cache_dir=self.kernel_db.parent if self.kernel_db else None,
                                fuse=fused_groups(self.cfg, {n: t.qtype for n, t in self.file.tensors.items()}))
    # float16 copies of the layers' matrices for the prefill chunks' products, where they fit in prefill_copy_mb
    self.dense_bytes = 0
    if prefill_copy_mb < 0: raise OrinError(f"prefill_copy_mb must be 0 or more, not {prefill_copy_mb}")
    self.prefill_copy_mb = prefill_copy_mb
    if quant.as_matrix(self.chunk):
      want = quant.dense_bytes(self.weights)
      if want <= prefill_copy_mb * 2**20:
        mats = quant.layer_matrices(self.weights)
        try:
          for w in mats: w.keep_dense()
          self.dense_bytes = want
          log.info(f"prefill: the layers' matrices kept in float16 too, {want / 2**20:.0f} MiB (prefill_copy_mb {prefill_copy_mb})")
        except (MemoryError, RuntimeError) as e:  # the device's memory is shared and may be short (the Orin): do without
          for w in mats: w.dense = None
          log.info(f"prefill: float16 copies of the layers' matrices ({want / 2**20:.0f} MiB) did not fit on the device "
                   f"({type(e).__name__}: {str(e)[:120]}): each chunk dequantizes its matrices instead")
      else: log.info(f"prefill: dequantizes each matrix in each chunk (float16 copies would take {want / 2**20:.0f} MiB, "
                     f"over prefill_copy_mb {prefill_copy_mb})")
    # a prefill chunk always runs `chunk` rows (a constant shape: matrix products on tensor cores, no symbolic
    # length); the last one of a prompt is padded, so the cache, tables and prompt reach a chunk further
    self.group_rows = group_rows(tc, max_batch)
    pad = max(self.chunk, VERIFY_SIZES[-1], self.group_rows)
    # the positions the steps' variables are bounded by, and the buffers' rows: the context, or a prewarm's reach
    self.reach = steps_reach(self.max_context, self.cfg.context_length) if reach else self.max_context
    self.model = Transformer(self.cfg, self.weights, self.reach, self.device, pad=pad, slots=max_batch)
    self.state = RunState(self.model.capacity, max_batch, self.cfg.vocab_size, self.device, self.group_rows)
    self.io = host_io(self.device)
    self._fetched: list[int] = []  # the slots of fetch_first's copy, until read_first
    # the model step queued ahead by the last decode(ahead=True), for the next round of the same slots: (slots, batch
    # size, each slot's position and input token); any other step clears it (it writes the logits that step left)
    self._ahead: tuple | None = None
    self.ahead_used = 0  # decode rounds that started from such a step
    self._verify_costs: dict[int, float] | None = None  # verify_costs(), measured on first use
    self.slots = [Slot() for _ in range(max_batch)]
    self.masked_slots: set[int] = set()  # slots whose mask row is not all ones
    self.batch_sizes = tuple(b for b in BATCH_SIZES if b <= max_batch) + ((max_batch,) if max_batch > 1 and max_batch not in BATCH_SIZES else ())
    # symbolic variables of the compiled steps; positions go to max_context: an idle row of a batch sits at its slot's
    # length, which may be the end of the context (the cache's padding holds what it writes there); a prewarm's to its
    # reach, so that a later start at another context up to it loads them (step_cache.py)
    self.v_pos = UOp.variable("start_pos", 0, self.reach)
    self.v_slot = UOp.variable("slot", 0, max_batch - 1)
    self.v_len = UOp.variable("chunk_len", 1, self.chunk)
    self.v_row = UOp.variable("hist_row", 0, HIST - 1)
    self.v_rows = [UOp.variable(f"pos{b}", 0, self.reach) for b in range(max(self.batch_sizes, default=0))]
    self.v_lens = [UOp.variable(f"len{b}", 1, self.group_rows) for b in range(max_batch)]
    self.v_blocks = UOp.variable("blocks", 1, self.model.capacity // ROW_BLOCK)
    self.v_short_blocks = UOp.variable("short_blocks", 1, self.model.capacity // SHORT_BLOCK)  # the short steps' (valid at any depth)
    # a decode or batch step whose rows all attend to at most this many keys runs the steps of SHORT_BLOCK-key blocks
    # (model.SHORT_KEYS; 0: never); the warm-up sets it to capture both kinds
    self.short_keys = SHORT_KEYS
    self.v_group_blocks = UOp.variable("group_blocks", 1, self.model.capacity // min((key_block(self.group_rows, b) for b in self.batch_sizes), default=ROW_BLOCK))  # Steps.group's
    self.steps = Steps(self)
    # the steps a start with this cache captured before (step_cache.py): nothing to schedule or capture
    from orin_llm import step_cache
    self.steps_file = step_cache.try_load(self)
    self.steps_loaded = self.steps_file is not None
    self.load_seconds = time.monotonic() - t0
    log.info(f"loaded {os.path.basename(str(path))}: {self.cfg.arch}, {self.cfg.n_layers} layers, dim {self.cfg.dim}, "
             f"context {self.max_context} x {max_batch} slot{'s' * (max_batch > 1)}, {self.weight_bytes() / 2**20:.0f} MiB of weights + "
             f"{f'{self.dense_bytes / 2**20:.0f} MiB of float16 copies + ' if self.dense_bytes else ''}"
             f"{self.kv_bytes() / 2**20:.0f} MiB KV cache (file {self.file.path.stat().st_size / 2**20:.0f} MiB; device memory in use "
             f"{GlobalCounters.mem_used / 2**20:.0f} MiB) in {self.load_seconds:.1f} s")

  # ------------------------------------------------------------------ memory
  def weight_bytes(self) -> int:
    return sum(w.nbytes() for w in self.weights.values())  # QuantWeight planes and float32 vectors alike
  def kv_bytes(self) -> int: return sum(b.cache.nbytes() for b in self.model.blocks)
  @property
  def max_batch(self) -> int: return len(self.slots)
  def prefill_copy_left(self) -> int:
    """MiB of the prefill_copy_mb bound this engine's copies leave (a draft model's engine takes the rest)."""
    return max(0, self.prefill_copy_mb - -(-self.dense_bytes // 2**20))

  # ------------------------------------------------------------------ slots
  def reset(self, slot: int | None = None):
    """Forgets what the slot (default: every slot) holds: its next prompt runs from position 0."""
    for i in range(len(self.slots)) if slot is None else [slot]: self.slots[i].cached, self.slots[i].next = [], None
    self._ahead = None
    if slot is None: self.io.pending, self._fetched = None, []  # a failure may leave a fetch unread
  @property
  def cached(self) -> list[int]:
    """Slot 0's cached tokens (the single-sequence API)."""
    return self.slots[0].cached

  def common_prefix(self, slot: int, tokens: list[int]) -> int:
    n = 0
    for a, b in zip(self.slots[slot].cached, tokens):
      if a != b: break
      n += 1
    return n

  def check_prompt(self, prompt: list[int]):
    if not prompt: raise OrinError("the prompt is empty (no tokens)")
    if len(prompt) >= self.max_context:
      raise OrinError(f"the prompt has {len(prompt)} tokens, but the context holds {self.max_context} (prompt plus at least one new token)")

  def _copy_in(self, buf: Tensor, start: int, values: np.ndarray):
    """buf.flat[start:start+len(values)] = values, queued behind the steps queued before it (hostio.py)."""
    self.io.upload(buf, start, values)

  def _copy_out(self, buf: Tensor, count: int) -> np.ndarray:
    """The first count elements of a realized state buffer, flat, once the steps queued before have run."""
    return self.io.read(buf, count)

  def _hist(self, n: int) -> np.ndarray:
    """The first n rows of the token history, (n, slots)."""
    W = self.state.hist.shape[1]
    return self._copy_out(self.state.hist, n * W).reshape(n, W)

  def set_mask(self, slot: int, words: np.ndarray | None):
    """The slot's allowed-token bitmask (structured.Constraint.mask_words; None: every token)."""
    if words is None:
      if slot not in self.masked_slots: return
      self.masked_slots.discard(slot)
      words = np.full(self.state.mask.shape[1], 0xFFFFFFFF, np.uint32)
    else: self.masked_slots.add(slot)
    self._copy_in(self.state.mask, slot * self.state.mask.shape[1], np.asarray(words, np.uint32))

  def _masks(self, masks, rows) -> bool:
    """Sets the bitmasks masks() returns ({slot: words or None}), once the model step is queued: the host computes them
    while the device runs it. Whether the choice over these rows needs the masked step."""
    if masks is not None:
      for slot, words in masks().items(): self.set_mask(slot, words)
    return any(r in self.masked_slots for r in rows)

  def set_sampling(self, slot: int, s: Sampling):
    if self.slots[slot].sampling != s:
      self._copy_in(self.state.params, slot * 4, np.array(s.as_list(), np.float32))
      self.slots[slot].sampling = s

  # ------------------------------------------------------------------ prefill and decode
  def chunk_plan(self, n: int) -> list[int]:
    """The chunk sizes that run n prompt tokens: the largest chunk while more than SMALL_CHUNK_MAX tokens are left
    (a padded matrix step costs about what SMALL_CHUNK_MAX tokens of small chunks do), then small chunks."""
    big, small, out = self.chunks[-1], self.chunks[0], []
    while n > 0:
      c = big if n > SMALL_CHUNK_MAX or small == big else small
      out.append(c); n -= c
    return out

  def _prompt_start(self, slot: int, tokens: list[int], sampling: Sampling) -> int:
    """Where the slot's prefill of tokens starts: after the prefix it caches of them, but at the last token at the
    latest (its logits choose the next token). The slot then caches that prefix alone, and samples as asked."""
    self.check_prompt(tokens)
    start = min(self.common_prefix(slot, tokens), len(tokens) - 1)
    self.set_sampling(slot, sampling)
    s = self.slots[slot]
    s.cached, s.next = s.cached[:start], None
    return start

  def prefill_chunks(self, slot: int, tokens: list[int], sampling: Sampling = Sampling(), mask=None) -> Iterator[int]:
    """Runs the tokens the slot has not cached (the last one always: its logits choose the next token), one chunk
    at a time, yielding the number of tokens queued so far after each; the chosen token is in next_tok[slot]. Stopping
    the iteration early leaves the slot holding the chunks that ran. mask: a callback giving the first token's
    bitmask (or None), called once the last chunk is queued."""
    pos = self._prompt_start(slot, tokens, sampling)
    s = self.slots[slot]
    for c in self.chunk_plan(len(tokens) - pos):
      n = min(c, len(tokens) - pos)
      # each chunk's tokens copied just before it: the prompt buffer is one for every slot, and the server runs other
      # slots' chunks between this prompt's (copied once up front, a prompt of two chunks or more ran its later
      # chunks on the tokens of the prompt that joined between them)
      self._copy_in(self.state.prompt, pos, np.array(tokens[pos:pos + n], np.int32))
      self._ahead = None  # the chunk writes the logits a step queued ahead left
      self.steps.chunk(c)(self.v_pos.bind(pos), self.v_slot.bind(slot), self.v_len.bind(n))
      pos += n
      s.cached = tokens[:pos]
      if pos < len(tokens): yield pos
    use_mask = self._masks(lambda: {slot: mask() if mask is not None else None}, [slot])  # a new job: no stale mask
    self.steps.choose("one", sampling.greedy, use_mask)(self.v_pos.bind(pos), self.v_slot.bind(slot), self.v_row.bind(0))
    yield pos

  def first_token(self, slot: int) -> int:
    """The token the slot's prefill chose (waits for the device)."""
    s = self.slots[slot]
    if s.next is None: s.next = int(self._copy_out(self.state.next_tok, slot + 1)[slot])
    return s.next

  def fetch_first(self, slots: list[int]):
    """Queues the copy to the host of the tokens chosen for these slots' prompts, whose last steps (prefill_chunks',
    prefill_together's) are queued; read_first waits for it. On CUDA (hostio.CudaHostIO) steps queued in between run
    while the host waits (the server queues the prompts of jobs that joined meanwhile); elsewhere the fetch itself
    waits. Those steps may write these slots' next_tok (a batch's idle rows choose too): the copy has its place before
    them."""
    self.io.fetch(self.state.next_tok, max(slots) + 1)
    self._fetched = list(slots)

  def read_first(self) -> dict[int, int]:
    """{slot: its first token} for fetch_first's slots, once their copy has run; first_token then returns it too."""
    out, slots, self._fetched = self.io.wait(), self._fetched, []
    for b in slots: self.slots[b].next = int(out[b])
    return {b: self.slots[b].next for b in slots}

  def prefill(self, slot: int, tokens: list[int], sampling: Sampling = Sampling(), mask=None) -> int:
    """prefill_chunks run to the end; returns the chosen next token."""
    for _ in self.prefill_chunks(slot, tokens, sampling, mask): pass
    return self.first_token(slot)

  def prefill_together(self, jobs: dict[int, tuple[list[int], Sampling]]) -> dict[int, int]:
    """One step over slots 0..B-1 (Steps.group) that runs the next group_rows tokens each of these slots has not
    cached of its prompt ({slot: (tokens, sampling)}; the last token always, as prefill_chunks runs it), and queues
    the choice of the first token of each prompt it completes (first_token reads it). Returns each slot's cached
    length. The other slots' rows run at their slot's length and write past what it caches, as a batch's idle rows
    do. Results equal prefill_chunks' (tests/test_batch.py): each row attends to its own slot's keys only."""
    assert jobs and self.max_batch > 1
    # over the first B slots, B the smallest batch size that holds them (as decode's): 3 clients joining slot 0's in
    # slots 1-3 of 8 run 4 x G rows, not 8 x G
    B, G = next(b for b in self.batch_sizes if b > max(jobs)), self.group_rows
    toks, pos, lens, done = np.zeros((B, G), np.int32), [], [], []
    for b in range(B):
      s = self.slots[b]
      if b in jobs:
        tokens, sampling = jobs[b]
        start = self._prompt_start(b, tokens, sampling)
        n = min(G, len(tokens) - start)
        toks[b, :n] = tokens[start:start + n]
        s.cached, s.next = tokens[:start + n], None
        pos.append(start); lens.append(n)
        if start + n == len(tokens): done.append(b)
      else: pos.append(min(len(s.cached), self.max_context)); lens.append(1)
    self._ahead = None  # the step writes the logits a step queued ahead left, and next_tok of every slot
    self._copy_in(self.state.group, 0, toks.reshape(-1))
    size = key_block(G, B)
    self.steps.group(B, G)(*[v.bind(p) for v, p in zip(self.v_rows, pos)], *[v.bind(n) for v, n in zip(self.v_lens, lens)],
                           self.v_group_blocks.bind((max(pos) + G + size - 1) // size))
    if done:  # each row chooses at the position after its last token, as prefill_chunks' choice does
      greedy_only = all(jobs[b][1].greedy for b in done)
      at = [p + n if b in done else p for b, (p, n) in enumerate(zip(pos, lens))]
      self.steps.choose(f"batch{B}", greedy_only)(*[v.bind(min(p, self.reach)) for v, p in zip(self.v_rows, at)], self.v_row.bind(0))
    return {b: len(self.slots[b].cached) for b in jobs}

  def decode(self, slots: list[int], n: int, masks=None, ahead: bool = False) -> np.ndarray:
    """n decode steps for each of the given slots, queued back to back: each slot's input is the token chosen for it
    last (next_tok), at the position after what it caches. Returns the chosen tokens, (n, len(slots)); each slot then
    caches its input and the first n-1 of them. masks (constrained requests; n = 1): a callback giving {slot: bitmask}
    (_masks), called once the model step is queued.
    ahead: the caller will likely decode the same slots next. The next round's first model step is queued behind an
    asynchronous copy of these tokens, before the host waits for them, so that the device runs it while the host
    reads the tokens, runs the grammar and computes the next mask (hostio.py); the next decode of these slots starts
    from it, unless another step ran in between. Wasted when the next round differs: the keys and values it wrote
    lie past what the slots cache."""
    assert 1 <= n <= HIST and slots and (masks is None or n == 1)
    if any(len(self.slots[s].cached) + n > self.max_context for s in slots): raise OrinError("decode past the end of the context")
    assert all(self.slots[s].next is not None for s in slots), "decode needs each slot's last choice (first_token)"
    greedy_only = all(self.slots[s].sampling is None or self.slots[s].sampling.greedy for s in slots)
    B = 1 if len(slots) == 1 else next(b for b in self.batch_sizes if b > max(slots))
    key = (tuple(slots), B, tuple((len(self.slots[s].cached), self.slots[s].next) for s in slots))
    started, self._ahead = self._ahead == key, None  # step 0's model step is queued already
    self.ahead_used += started
    ahead = ahead and all(len(self.slots[s].cached) + n + 1 <= self.max_context for s in slots)
    W = self.state.hist.shape[1]
    if B == 1:
      s = slots[0]
      # each step's input is next_tok, which the previous choice wrote; written here from the host's copy first,
      # since a batch's idle rows choose (and write next_tok) too, for slots that may be joining or waiting to be reused
      if not started: self._copy_in(self.state.next_tok, s, np.array([self.slots[s].next], np.int32))
      base = len(self.slots[s].cached)
      # each step of short or long blocks by the keys its row attends to (position + 1)
      model = lambda p: self.steps.chunk(1, self.key_blocks(p + 1)[0])(self.v_pos.bind(p), self.v_slot.bind(s), self.v_len.bind(1))
      for i in range(n):
        if i or not started: model(base + i)
        choose = self.steps.choose("one", greedy_only, self._masks(masks, [s]))
        choose(self.v_pos.bind(base + i + 1), self.v_slot.bind(s), self.v_row.bind(i))
      cols = [s]
    else:
      if not started: self._copy_in(self.state.next_tok, 0, np.array([self.slots[b].next or 0 for b in range(B)], np.int32))
      # rows of idle slots sit at their slot's length: what they write there lies past everything the slot caches
      base = [min(len(self.slots[b].cached), self.max_context - n) for b in range(B)]
      def model(pos: list[int]):
        self.batch_step(pos)
      for i in range(n):
        if i or not started: model([p + i for p in base])
        choose = self.steps.choose(f"batch{B}", greedy_only, self._masks(masks, slots))  # idle rows: all ones, or stale
        choose(*[v.bind(p + i + 1) for v, p in zip(self.v_rows, base)], self.v_row.bind(i))
      cols = slots
    if ahead:
      self.io.fetch(self.state.hist, n * W)
      nxt = {s: len(self.slots[s].cached) + n for s in slots}
      if B == 1: model(nxt[slots[0]])
      else: model([nxt.get(b, min(len(self.slots[b].cached), self.max_context - 1)) for b in range(B)])
      out = self.io.wait().reshape(n, W)[:, cols]
      self._ahead = (tuple(slots), B, tuple((nxt[s], int(out[n - 1, j])) for j, s in enumerate(slots)))
    else: out = self._hist(n)[:, cols]
    for j, s in enumerate(slots):
      c = self.slots[s]
      c.cached, c.next = c.cached + [c.next] + out[:n - 1, j].tolist(), int(out[n - 1, j])
    return out

  def key_blocks(self, top: int) -> tuple[bool, int, UOp]:
    """The attention blocks of a decode or batch step whose longest row attends to `top` keys: (whether the short
    steps take it, keys per block, a batch step's variable for the count of blocks): SHORT_BLOCK keys while top is at
    most short_keys, else ROW_BLOCK."""
    short = top <= self.short_keys
    return (short, SHORT_BLOCK, self.v_short_blocks) if short else (short, ROW_BLOCK, self.v_blocks)

  def batch_step(self, pos: list[int]):
    """Queues the model step of rows 0..B-1 at these positions (B = len(pos), a batch size), in the blocks key_blocks
    gives, bound to those the longest row needs."""
    top = max(pos) + 1
    short, size, nb = self.key_blocks(top)
    self.steps.batch(len(pos), short)(*[v.bind(p) for v, p in zip(self.v_rows, pos)], nb.bind((top + size - 1) // size))

  def verify(self, slot: int, proposals: list[int]) -> list[int]:
    """Speculative decoding's step (speculative.py): the slot's last choice and the proposed tokens after it run as
    one step, each row choosing as a decode step at its position would; the proposals are accepted while they equal
    those choices. Returns the tokens chosen up to and including the first that differs from its proposal (all of
    them when every proposal holds): 1 to len(proposals)+1 tokens. The slot then caches its last choice and the
    accepted proposals; what the rejected ones wrote into the cache lies past that and is overwritten later."""
    s = self.slots[slot]
    assert s.next is not None and proposals
    pos = len(s.cached)
    proposals = proposals[:max(0, min(VERIFY_SIZES[-1] - 1, self.max_context - 1 - pos))]
    if not proposals: return self.decode([slot], 1)[:, 0].tolist()
    rows = [s.next] + proposals
    K = next(v for v in VERIFY_SIZES if v >= len(rows))
    self._copy_in(self.state.prompt, pos, np.array(rows + [0] * (K - len(rows)), np.int32))
    greedy_only = s.sampling is None or s.sampling.greedy
    self._ahead = None
    self.steps.verify(K)(self.v_pos.bind(pos), self.v_slot.bind(slot))
    self.steps.choose(f"verify{K}", greedy_only)(self.v_pos.bind(pos), self.v_slot.bind(slot))
    chosen = self._hist(K)[:len(rows), slot].tolist()
    a = 0
    while a < len(proposals) and proposals[a] == chosen[a]: a += 1
    s.cached, s.next = s.cached + rows[:a + 1], chosen[a]
    return chosen[:a + 1]

  def verify_costs(self, slot: int) -> dict[int, float]:
    """Each compiled verify step's cost in plain decode steps (speculative.Speculator weighs proposals with it),
    measured once, at the slot's next position: a verify step with its host read against a decode round of 8 steps
    queued back to back, per step, as plain decoding runs. The slot keeps what it caches; the keys and values the
    steps wrote lie past it."""
    if self._verify_costs is None:
      s = self.slots[slot]
      cached, nxt = list(s.cached), s.next
      if nxt is None or len(cached) + 2 * VERIFY_SIZES[-1] + 1 >= self.max_context: return {K: float(K) for K in VERIFY_SIZES}
      def timed(fn, reps: int = 4) -> float:
        fn()  # compiles on first use
        t = time.perf_counter()
        for _ in range(reps): fn()
        return (time.perf_counter() - t) / reps
      def restore(): s.cached, s.next = list(cached), nxt
      def plain(): restore(); self.decode([slot], VERIFY_SIZES[-1])
      step = timed(plain) / VERIFY_SIZES[-1]
      costs = {}
      for K in VERIFY_SIZES:
        def ver(K=K): restore(); self.verify(slot, [nxt] * (K - 1))
        costs[K] = timed(ver) / step
      restore()
      self._ahead, self._verify_costs = None, costs
      log.info("speculative decoding: a verify step costs " + ", ".join(f"{c:.1f} decode steps at {K} rows" for K, c in costs.items()))
    return self._verify_costs

  # ------------------------------------------------------------------ generation
  def generate(self, prompt: list[int], max_new: int, sampling: Sampling = Sampling(), stop_ids=frozenset(),
               lookahead: int = DEFAULT_LOOKAHEAD, slot: int = 0, speculator=None, constraint=None) -> Iterator[int]:
    """Yields up to max_new tokens after the prompt, ending after a token in stop_ids (yielded) or at the end of the
    context. Keys and values of a prompt prefix the slot holds from before are reused. speculator
    (speculative.Speculator): tokens come from verify steps over its proposals while it has any. constraint
    (structured.Constraint): each token is chosen among those its mask_words() allows, and generation ends after
    the token for which its advance() says the grammar is complete."""
    if constraint is not None:
      yield from self._generate_constrained(prompt, max_new, sampling, stop_ids, slot, constraint)
      return
    tok = self.prefill(slot, prompt, sampling)
    pos, produced, pending = len(prompt), 0, [tok]  # pos: where tok goes
    while pending:
      tok = pending.pop(0)
      produced += 1
      yield tok
      if tok in stop_ids or produced >= max_new or pos + 1 >= self.max_context: break
      if not pending:
        room = min(max_new - produced, self.max_context - 1 - pos)  # tokens still wanted and allowed
        s = self.slots[slot]
        if speculator is not None and speculator.cost is None: speculator.cost = self.verify_costs(slot)
        props = []
        if speculator is not None and (k := min(speculator.want(), room - 1)) > 0:
          props = speculator.source.propose(s.cached + [s.next], k)[:k]
        if props:
          pending = self.verify(slot, props)
          speculator.update(len(props), len(pending) - 1)
        else:
          # while speculating, plain decoding runs in short stretches: proposals may appear after any token. The next
          # round's step is queued ahead all the same: wasted (a decode step's time) only where a verify follows
          n = max(1, min(lookahead if speculator is None else speculator.stretch(lookahead), HIST, room))
          pending = self.decode([slot], n, ahead=room > n)[:, 0].tolist()
          if speculator is not None: speculator.rested(n)
      pos += 1

  def _generate_constrained(self, prompt, max_new, sampling, stop_ids, slot, constraint) -> Iterator[int]:
    """Lookahead 1: the mask for token t+1 depends on token t, so each token reaches the host (and the grammar)
    before the next choice; the host computes that mask while the device runs the model step token t feeds."""
    try:
      tok, produced = self.prefill(slot, prompt, sampling, mask=constraint.mask_words), 0
      while True:
        produced += 1
        done = constraint.advance(tok)
        yield tok
        if done or tok in stop_ids or produced >= max_new or len(self.slots[slot].cached) + 1 >= self.max_context: break
        tok = int(self.decode([slot], 1, masks=lambda: {slot: constraint.mask_words()}, ahead=produced + 1 < max_new)[0, 0])
    finally: self.set_mask(slot, None)

  def forward(self, tokens: list[int], start: int, slot: int = 0) -> "np.ndarray":
    """Runs tokens at positions start.. uncompiled (no JIT) and returns the last one's logits: the plain path that
    tests and checks compare the compiled steps against."""
    self._copy_in(self.state.prompt, start, np.array(tokens, np.int32))
    self._ahead = None
    logits = self.model(self.state.prompt[start:start + len(tokens)], Rows((start,), len(tokens), slot)).numpy()[0]
    self.slots[slot].cached, self.slots[slot].next = self.slots[slot].cached[:start] + list(tokens), None
    return logits

  def profile_step(self, slot: int = 0) -> Tensor:
    """The single-sequence decode step (model and greedy choice) at the slot's next position, uncompiled: its kernels
    one by one (bench counts them, profiles time them)."""
    self._ahead = None
    return self.steps.one_decode(self.v_pos.bind(len(self.slots[slot].cached)), self.v_slot.bind(slot))

def searched(name: str) -> bool:
  """Whether a step of this name (Steps' names) takes the BEAM search, under settings.BEAM_STEPS."""
  return settings.BEAM_STEPS == "all" or name.startswith("group") or (name.startswith("chunk") and name.split("-")[0] != "chunk1")

def _unsearched(jit: TinyJit, *args):
  """A step called (and so, at its first call, captured and compiled) with BEAM off: the hand-coded opts."""
  with Context(BEAM=0): return jit(*args)

class Steps:
  """The engine's compiled steps (TinyJits), by name:
  chunk{T}       one sequence, T tokens from start_pos in slot `slot` (T = 1: decoding alone) -> logits[0] of row chunk_len
  batch{B}       sequences in slots 0..B-1, one token each at pos0..pos{B-1} -> logits[0:B]
  chunk1-short, batch{B}-short  the same in the attention's blocks of model.SHORT_BLOCK keys (Engine.short_keys)
  group{B}x{G}   the prompts of slots 0..B-1, G tokens each from pos{b}, len{b} of them real -> logits[0:B] of each last one
  verify{K}      one sequence, K tokens from start_pos in slot `slot` -> logits[0:K] of every row (speculative decoding)
  choose-{rows}-{greedy|sampled}  a token per row of logits -> next_tok and hist[hist_row] (verify: hist[0:K, slot]);
                 -masked: among each row's tokens allowed by its row of mask (constrained requests: their own steps,
                 so that unconstrained ones run exactly what they ran before)
  Model and choice are apart: greedy and sampled requests share the model's graphs, which are what a start-up spends
  its time capturing (docs/PERF.md: start-up)."""
  def __init__(self, eng: Engine):
    self.eng, self.jits = eng, {}

  def _get(self, name: str, fn) -> TinyJit:
    if name not in self.jits:
      jit = TinyJit(fn)
      # capture on the first call: TinyJit runs a function once uncompiled before capturing it, so that lazy inputs
      # get realized outside the graph; everything the steps read is realized at load, and skipping that run saves
      # a start-up one of the two schedulings of each step (docs/PERF.md: start-up)
      jit.cnt = 1
      self.jits[name] = jit
      log.info(f"compiling the {name} step (first use; cached kernels make this quick)")
    # a step BEAM does not take is called with BEAM off until captured (its first call compiles it); after that, and
    # for steps loaded from a steps file, the TinyJit itself (scripts read its capture)
    jit = self.jits[name]
    return jit if searched(name) or jit.captured is not None else functools.partial(_unsearched, jit)

  def chunk(self, T: int, short: bool = False) -> TinyJit:
    e, st = self.eng, self.eng.state
    assert T == 1 or not short
    block = SHORT_BLOCK if short else ROW_BLOCK
    def fn(pos, slot, n):
      src = st.prompt[pos:pos + T] if T > 1 else st.next_tok[slot:slot + 1]  # decode reads the last choice
      return st.logits[0:1].assign(e.model(src, Rows((pos,), T, slot, row_block=block), n)).realize()
    return self._get(f"chunk{T}{'-short' * short}", fn)

  def batch(self, B: int, short: bool = False) -> TinyJit:
    e, st = self.eng, self.eng.state
    block = SHORT_BLOCK if short else ROW_BLOCK
    def fn(*args):
      pos, blocks = args[:B], args[B]
      return st.logits[0:B].assign(e.model(st.next_tok[0:B], Rows(tuple(pos), 1, 0, blocks, block))).realize()
    return self._get(f"batch{B}{'-short' * short}", fn)

  def group(self, B: int, G: int) -> TinyJit:
    e, st = self.eng, self.eng.state
    def fn(*args):
      pos, lens, blocks = args[:B], args[B:2 * B], args[2 * B]
      x = e.model(st.group[0:B].reshape(-1), Rows(tuple(pos), G, 0, blocks), n=tuple(lens))
      return st.logits[0:B].assign(x).realize()
    return self._get(f"group{B}x{G}", fn)

  def verify(self, K: int) -> TinyJit:
    e, st = self.eng, self.eng.state
    def fn(pos, slot):
      return st.logits[0:K].assign(e.model(st.prompt[pos:pos + K], Rows((pos,), K, slot), all_rows=True)).realize()
    return self._get(f"verify{K}", fn)

  def choose(self, rows: str, use_greedy: bool, use_mask: bool = False) -> TinyJit:
    """rows "one": logits[0] for the slot `slot` at position start_pos; "batch{B}": logits[0:B] for slots 0..B-1.
    use_mask: masked by those slots' rows of mask (not for verify: constrained requests do not speculate)."""
    st = self.eng.state
    def pick(logits, params, pos, mask=None):
      # sampling reads the logits in several reductions: masked once into a buffer, not unpacked in each of them
      if mask is not None: logits = masked(logits, mask) if use_greedy else masked(logits, mask).contiguous()
      return greedy(logits) if use_greedy else sample(logits, params, pos)
    if rows == "one":
      def fn(pos, slot, row):
        t = pick(st.logits[0:1], st.params[slot:slot + 1], pos, st.mask[slot:slot + 1] if use_mask else None)
        return Tensor.realize(st.next_tok[slot:slot + 1].assign(t), st.hist[row:row + 1, slot:slot + 1].assign(t.reshape(1, 1)))
    elif rows.startswith("verify"):  # K rows of one sequence, row i choosing the token at position start_pos+i+1
      K = int(rows.removeprefix("verify"))
      def fn(pos, slot):
        t = pick(st.logits[0:K], st.params[slot:slot + 1].expand(K, 4), Tensor(pos).reshape(1) + 1 + Tensor.arange(K))
        return st.hist[0:K, slot:slot + 1].assign(t.reshape(K, 1)).realize()
    else:
      B = int(rows.removeprefix("batch"))
      def fn(*args):
        pos, row = args[:B], args[B]
        t = pick(st.logits[0:B], st.params[0:B], Tensor.stack(*[Tensor(p) for p in pos]), st.mask[0:B] if use_mask else None)
        return Tensor.realize(st.next_tok[0:B].assign(t), st.hist[row:row + 1, 0:B].assign(t.reshape(1, B)))
    assert not (use_mask and rows.startswith("verify"))
    return self._get(f"choose-{rows}-{'greedy' if use_greedy else 'sampled'}{'-masked' * use_mask}", fn)

  def one_decode(self, pos, slot) -> Tensor:
    """The decode step's kernels as the compiled chunk1 and choose steps run them: the logits written to their buffer
    first, as the step apart from the choice writes them. Unwritten, the choice's first reduction (groups of 256
    logits) fused into the output head's matvec, a kernel the server never runs (the twentieth session's CI)."""
    e, st = self.eng, self.eng.state
    logits = st.logits[0:1].assign(e.model(st.next_tok[slot:slot + 1], Rows((pos,), 1, slot)))
    return st.next_tok[slot:slot + 1].assign(greedy(logits))
