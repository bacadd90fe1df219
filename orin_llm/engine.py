"""The engine: a loaded model, its KV cache and token buffer on the device, and the compiled steps
that extend them. Everything the server, CLI and benchmark run goes through `Engine.generate`.

Tokens live on the device: the prompt in `prompt_buf`, chosen tokens in `tok_buf` (position -> id).
A model step (prefill chunk or decode) writes the last position's logits into `logits`, and a choice
step (greedy or sampled) writes the token it picks at the position after the input; a decode step
reads its input token from `tok_buf`, so consecutive decode steps need no host round trip: the host
can queue several before reading what they chose (`lookahead`). The only things that change between
replays of a compiled step are symbolic variables: the start position, the chunk length (prefill)
and the position a choice is written to.
"""
from __future__ import annotations
import os, time
from typing import Iterator
import numpy as np
from tinygrad import Tensor, TinyJit, UOp, dtypes, Device
from tinygrad.helpers import GlobalCounters
from orin_llm.errors import OrinError
from orin_llm.loader import open_model, load_weights
from orin_llm.model import Transformer, fused_groups
from orin_llm.sampling import Sampling, greedy, masked, sample
from orin_llm import log

DEFAULT_CONTEXT = 4096
# prompt tokens per prefill step. On a GPU, chunks of 512 rows run the weights as float16 matrix products on tensor
# cores (quant.MATMUL_ROWS; H200, pp512 at BEAM=0: 8030 tok/s against 7187 with chunks of 256, docs/PERF.md), at the
# price that a short prompt costs a whole padded chunk. Where the device has no tensor cores to feed (tinygrad's CPU
# backend), a short prompt in small chunks answers sooner.
DEFAULT_CHUNK, NO_TC_CHUNK = 512, 32
# decode steps queued before the host reads their tokens: the host needs ~0.3 ms to queue a step (H200, docs/PERF.md),
# which overlaps the device's work only while steps are queued; 8 tokens arrive together (~13 ms at 600 tok/s)
DEFAULT_LOOKAHEAD = 8

class Engine:
  def __init__(self, path, max_context: int | None = None, device: str | None = None, chunk: int | None = None,
               cache: str | os.PathLike | bool | None = None, shipped: str | os.PathLike | None = None):
    """cache: a directory (True: kernel_cache.cache_dir()) for the kernel database chosen for this
    model and device (a missing one copied from `shipped`) and the repacked planes; None: neither,
    tinygrad uses $CACHEDB."""
    t0 = time.monotonic()
    self.file, self.cfg = open_model(path)
    self.path, self.device = path, device or Device.DEFAULT
    self.max_context = min(self.cfg.context_length, max_context or DEFAULT_CONTEXT)
    if chunk is None: chunk = DEFAULT_CHUNK if Device[self.device].renderer.tensor_cores else NO_TC_CHUNK
    self.chunk = min(chunk, self.max_context)
    self.kernel_db = None
    if cache is not None and cache is not False:
      from orin_llm import kernel_cache
      cache = kernel_cache.cache_dir(None if cache is True else cache)
      # before anything is realized: tinygrad opens its database at the first kernel
      self.kernel_db = kernel_cache.select(cache, self.device, self.cfg, self.file.tensors, shipped=shipped)
    self.weights = load_weights(self.file, self.cfg, self.device, cache_dir=cache if self.kernel_db else None,
                                fuse=fused_groups(self.cfg, {n: t.qtype for n, t in self.file.tensors.items()}))
    # a prefill chunk always runs `chunk` rows (a constant shape: matrix products on tensor cores, no symbolic
    # length); the last one of a prompt is padded, so the prompt buffer, cache and tables reach a chunk further
    self.model = Transformer(self.cfg, self.weights, self.max_context, self.device, pad=self.chunk)
    # prompt tokens (read by prefill) and chosen tokens (written by every step, read by decode) are kept apart:
    # a prefill chunk writes its choice at the position after it, where the next chunk's prompt token lies
    self.prompt_buf = Tensor.zeros(self.max_context + self.chunk, dtype=dtypes.int32, device=self.device).contiguous().realize()
    self.tok_buf = Tensor.zeros(self.max_context + 1, dtype=dtypes.int32, device=self.device).contiguous().realize()
    self.params = Tensor(Sampling().as_list(), dtype=dtypes.float32, device=self.device).contiguous().realize()
    self._params: list[float] | None = None
    self.v_pos = UOp.variable("start_pos", 0, self.max_context - 1)
    self.v_len = UOp.variable("chunk_len", 1, self.chunk)
    self.v_next = UOp.variable("next_pos", 1, self.max_context)  # where a choice is written
    self.logits = Tensor.zeros(self.cfg.vocab_size, dtype=dtypes.float32, device=self.device).contiguous().realize()
    # the allowed-token bitmask of a constrained request (structured.Constraint), read only by the masked choice
    # steps; allocated here, not on first use, so that captured steps (step_cache) always find it
    self.mask = Tensor.full(((self.cfg.vocab_size + 31) // 32,), 0xFFFFFFFF, dtype=dtypes.uint32, device=self.device).contiguous().realize()
    self._jits: dict[tuple[str, bool], TinyJit] = {}
    self.cached: list[int] = []  # tokens whose keys and values are in the cache, from position 0
    # the steps a start with this cache captured before (step_cache.py): nothing to schedule or capture
    from orin_llm import step_cache
    self.steps_file = step_cache.try_load(self)
    self.steps_loaded = self.steps_file is not None
    self.load_seconds = time.monotonic() - t0
    log.info(f"loaded {os.path.basename(str(path))}: {self.cfg.arch}, {self.cfg.n_layers} layers, dim {self.cfg.dim}, "
             f"context {self.max_context}, {self.weight_bytes() / 2**20:.0f} MiB of weights + {self.kv_bytes() / 2**20:.0f} MiB KV cache "
             f"(file {self.file.path.stat().st_size / 2**20:.0f} MiB; device memory in use {GlobalCounters.mem_used / 2**20:.0f} MiB) "
             f"in {self.load_seconds:.1f} s")

  # ------------------------------------------------------------------ memory
  def weight_bytes(self) -> int:
    return sum(w.nbytes() for w in self.weights.values())  # QuantWeight planes and float32 vectors alike
  def kv_bytes(self) -> int: return sum(b.cache.nbytes() for b in self.model.blocks)

  # ------------------------------------------------------------------ compiled steps
  def _logits(self, start_pos, T, prefill: bool = False, n=None) -> Tensor:
    """The logits after the n-th of T tokens from start_pos (default: the last)."""
    src = self.prompt_buf if prefill else self.tok_buf  # prefill reads the prompt, decode the last choice
    return self.model(src[start_pos:start_pos + T], start_pos, n)

  def _choice(self, logits: Tensor, pos, use_greedy: bool) -> Tensor:
    """Writes the token chosen from logits at tok_buf[pos]."""
    nxt = greedy(logits) if use_greedy else sample(logits, self.params, pos)
    return self.tok_buf[pos:pos + 1].assign(nxt)

  def _step(self, start_pos, T, use_greedy: bool, prefill: bool = False, n=None) -> Tensor:
    """One step uncompiled, model and choice together: the kernels the compiled steps run (bench, profiles)."""
    return self._choice(self._logits(start_pos, T, prefill, n), start_pos + (T if n is None else n), use_greedy)

  def _jit(self, kind: str, use_greedy: bool | None = None) -> TinyJit:
    """The compiled steps: "prefill" and "decode" run the model into self.logits, "choose" (greedy or sampled)
    picks a token from it. Kept apart, greedy and sampled requests share the model's two graphs, which are
    what a start-up spends its time capturing (docs/PERF.md: start-up)."""
    if (kind, use_greedy) not in self._jits:
      if kind == "prefill": fn = lambda sp, n: self.logits.assign(self._logits(sp, self.chunk, True, n)).realize()
      elif kind == "decode": fn = lambda sp: self.logits.assign(self._logits(sp, 1)).realize()
      elif kind == "choose_masked":
        # sampling reads the logits in several reductions: masked once into a buffer, not unpacked in each of them
        fn = lambda nx: self._choice(masked(self.logits, self.mask) if use_greedy else masked(self.logits, self.mask).contiguous(), nx, use_greedy).realize()
      else: fn = lambda nx: self._choice(self.logits, nx, use_greedy).realize()
      jit = TinyJit(fn)
      # capture on the first call: TinyJit runs a function once uncompiled before capturing it, so that lazy inputs
      # get realized outside the graph; everything the steps read is realized at load, and skipping that run saves
      # a start-up one of the two schedulings of each step (docs/PERF.md: start-up)
      jit.cnt = 1
      self._jits[(kind, use_greedy)] = jit
      what = {True: "greedy ", False: "sampled ", None: ""}[use_greedy] + {"choose": "choice", "choose_masked": "masked choice"}.get(kind, f"{kind} step")
      log.info(f"compiling the {what} (first use; cached kernels make this quick)")
    return self._jits[(kind, use_greedy)]

  @staticmethod
  def _copy_in(buf: Tensor, start: int, values: np.ndarray):
    """buf[start:start+len(values)] = values as a plain host-to-device copy. A slice assign would compile
    a kernel for each length and offset: a BEAM search inside a request for every new prompt length."""
    from tinygrad.device import Buffer
    b = buf.uop.buffer
    assert values.dtype.itemsize == b.dtype.itemsize
    src = Buffer("PYTHON", len(values), b.dtype, opaque=memoryview(bytearray(np.ascontiguousarray(values).tobytes())))
    b.view(len(values), b.dtype, start * b.dtype.itemsize).ensure_allocated().copy_from(src)

  @staticmethod
  def _raw(buf: Tensor, start: int, n: int):
    """Elements start..start+n of a realized Tensor's device buffer, as a tinygrad Buffer view."""
    b = buf.uop.buffer
    return b.view(n, b.dtype, start * b.dtype.itemsize).ensure_allocated()

  def _read_token(self, pos: int) -> int:
    """tok_buf[pos], copied straight out of the device buffer: a Tensor read (`.item()`) schedules a kernel, and
    Buffer.copy_from builds a graph, each a few ms of host time that a constrained request (one read and one
    mask upload per token) would pay on every token."""
    v, out = self._raw(self.tok_buf, pos, 1), np.empty(1, np.int32)
    v.allocator._copyout(memoryview(out).cast("B"), v._buf)  # waits for the queued steps, as any read does
    return int(out[0])

  def _set_mask(self, words: np.ndarray):
    """The bitmask into self.mask, as _read_token: the allocator's own copy (queued in order on a GPU)."""
    v = self._raw(self.mask, 0, len(words))
    v.allocator._copyin(v._buf, memoryview(np.ascontiguousarray(words, np.uint32)).cast("B"))

  def _set_sampling(self, s: Sampling):
    if (vals := s.as_list()) != self._params:
      self._copy_in(self.params, 0, np.array(vals, np.float32))
      self._params = vals

  def prefill(self, tokens: list[int], start: int, use_greedy: bool | None) -> None:
    """Runs tokens[start:] through the model; the chosen next token lands at tok_buf[len(tokens)]
    (use_greedy None: no choice, the logits stay in self.logits)."""
    self._copy_in(self.prompt_buf, start, np.array(tokens[start:], np.int32))
    jit = self._jit("prefill")
    for s in range(start, len(tokens), self.chunk):
      jit(self.v_pos.bind(s), self.v_len.bind(min(self.chunk, len(tokens) - s)))
    if use_greedy is not None: self._jit("choose", use_greedy)(self.v_next.bind(len(tokens)))
    self.cached = list(tokens)

  def decode(self, pos: int, n: int, use_greedy: bool) -> list[int]:
    """n decode steps from position pos (whose token is already in tok_buf), queued back to back."""
    step, choose = self._jit("decode"), self._jit("choose", use_greedy)
    for i in range(n):
      step(self.v_pos.bind(pos + i))
      choose(self.v_next.bind(pos + i + 1))
    return self.tok_buf[pos + 1:pos + 1 + n].tolist() if n > 1 else [int(self.tok_buf[pos + 1].item())]

  def forward(self, tokens: list[int], start: int) -> "np.ndarray":
    """Runs tokens at positions start.. uncompiled (no JIT) and returns the last one's logits:
    the plain path that tests and checks compare the compiled steps against."""
    self._copy_in(self.prompt_buf, start, np.array(tokens, np.int32))
    logits = self.model(self.prompt_buf[start:start + len(tokens)], start).numpy()
    self.cached = self.cached[:start] + list(tokens)
    return logits

  # ------------------------------------------------------------------ generation
  def check_prompt(self, prompt: list[int]):
    if not prompt: raise OrinError("the prompt is empty (no tokens)")
    if len(prompt) >= self.max_context:
      raise OrinError(f"the prompt has {len(prompt)} tokens, but the context holds {self.max_context} (prompt plus at least one new token)")

  def generate(self, prompt: list[int], max_new: int, sampling: Sampling = Sampling(), stop_ids=frozenset(),
               lookahead: int = DEFAULT_LOOKAHEAD, constraint=None) -> Iterator[int]:
    """Yields up to max_new tokens after the prompt, ending after a token in stop_ids (yielded) or at
    the end of the context. Keys and values of a prompt prefix seen before are reused.
    constraint (structured.Constraint): each token is chosen among those its mask_words() allows, and
    generation ends after the token for which its advance() says the grammar is complete."""
    self.check_prompt(prompt)
    common = 0
    for a, b in zip(self.cached, prompt):
      if a != b: break
      common += 1
    start = min(common, len(prompt) - 1)  # the last prompt token always runs: its logits choose the next one
    self._set_sampling(sampling)
    if constraint is not None:
      yield from self._generate_constrained(prompt, start, max_new, sampling.greedy, stop_ids, constraint)
      return
    self.prefill(prompt, start, sampling.greedy)
    pos, produced = len(prompt), 0
    pending = [int(self.tok_buf[pos].item())]
    while pending:
      tok = pending.pop(0)
      produced += 1
      yield tok
      if tok in stop_ids or produced >= max_new or pos + 1 >= self.max_context: break
      if not pending:
        n = max(1, min(lookahead, max_new - produced, self.max_context - 1 - pos))
        pending = self.decode(pos, n, sampling.greedy)
        # decode wrote keys/values for positions pos .. pos+n-1, whose tokens are tok and pending[:-1]
        self.cached = self.cached[:pos] + [tok] + pending[:-1]
      pos += 1

  def _generate_constrained(self, prompt: list[int], start: int, max_new: int, use_greedy: bool, stop_ids, constraint) -> Iterator[int]:
    """Lookahead 1: the mask for token t+1 depends on token t, so each token reaches the host (and the grammar)
    before the next choice. The model step that token t feeds does not need it on the host, though, and runs while
    the host computes the next mask. With a pipe (_TokenPipe: CUDA) that step is queued right behind the choice and
    the token's copy, and the host waits for the copy alone: the device never waits for the host while the host's
    work per token (queueing two steps, the grammar) is shorter than a model step. Without one, the step is queued
    once the token is read, which waits for everything queued: the device idles while the host queues it."""
    self.prefill(prompt, start, None)  # queued; mask 0 is computed while it runs
    choose = {m: self._jit("choose_masked" if m else "choose", use_greedy) for m in (True, False)}
    decode, pos, pipe = self._jit("decode"), len(prompt), self._token_pipe()
    for produced in range(1, max_new + 1):
      words = constraint.mask_words()
      if words is not None: pipe.upload(words) if pipe else self._set_mask(words)
      choose[words is not None](self.v_next.bind(pos))
      queued = pipe is not None and produced < max_new and pos + 1 < self.max_context  # a next step may be needed
      if pipe is not None:
        pipe.fetch(pos)
        if queued: decode(self.v_pos.bind(pos))  # behind the token's copy; wasted if this token ends the answer
        tok = pipe.wait()
      else: tok = self._read_token(pos)
      done = constraint.advance(tok)
      last = done or tok in stop_ids or produced >= max_new or pos + 1 >= self.max_context
      if not last and not queued:
        decode(self.v_pos.bind(pos))  # queued before the token goes out: it runs while the consumer and the grammar work
        queued = True
      if queued: self.cached = self.cached[:pos] + [tok]  # that step writes tok's keys and values at pos
      yield tok
      if last: break
      pos += 1

  def _token_pipe(self):
    """The _TokenPipe of this engine's device, None where there is none (then reads wait for the whole queue)."""
    if not hasattr(self, "_pipe"):
      self._pipe = None
      if self.device.split(":")[0] == "CUDA":
        try: self._pipe = _CudaPipe(self)
        except Exception as e: log.info(f"constrained decoding: no asynchronous token read on {self.device} ({type(e).__name__}: {e})")
    return self._pipe

class _TokenPipe:
  """The host side of a constrained request's steps: upload(words) puts the bitmask into the engine's mask buffer,
  fetch(pos) queues the copy of tok_buf[pos] to the host behind the steps queued so far, wait() returns it once
  that copy is done, while steps queued after it still run. This one works on every device, with the allocator's
  copies (its wait waits for everything queued); tests use it to run the pipelined loop on the CPU."""
  def __init__(self, eng): self.eng, self.pos = eng, None
  def upload(self, words: np.ndarray): self.eng._set_mask(words)
  def fetch(self, pos: int): self.pos = pos
  def wait(self) -> int: return self.eng._read_token(self.pos)

class _CudaPipe(_TokenPipe):
  """CUDA: both copies go through one pinned host buffer as async copies on the default stream, the one tinygrad
  queues its kernels and graphs on, so they are ordered with the steps; wait() synchronizes on an event recorded
  after the token's copy rather than on the device. The buffer's mask half is rewritten only after the previous
  token's event, which follows the previous mask's copy."""
  def __init__(self, eng):
    import ctypes
    from tinygrad.runtime.autogen import cuda
    from tinygrad.runtime.ops_cuda import check
    self.ct, self.cuda, self.check, self.dev = ctypes, cuda, check, Device[eng.device]
    self.words = eng.mask.shape[0]
    check(cuda.cuCtxSetCurrent(self.dev.context))
    self.host = ctypes.c_void_p()
    check(cuda.cuMemHostAlloc(ctypes.byref(self.host), 8 + 4 * self.words, 0x01))  # [token, pad, mask words]
    self.event = cuda.CUevent()
    check(cuda.cuEventCreate(ctypes.byref(self.event), 0x2))  # CU_EVENT_DISABLE_TIMING
    self.mask_ptr, self.tok_ptr = eng._raw(eng.mask, 0, 1)._buf.value, eng._raw(eng.tok_buf, 0, 1)._buf.value
  def upload(self, words: np.ndarray):
    c, n = self.cuda, 4 * len(words)
    self.check(c.cuCtxSetCurrent(self.dev.context))
    self.ct.memmove(self.host.value + 8, np.ascontiguousarray(words, np.uint32).ctypes.data, n)
    self.check(c.cuMemcpyHtoDAsync_v2(c.CUdeviceptr_v2(self.mask_ptr), self.ct.c_void_p(self.host.value + 8), n, None))
  def fetch(self, pos: int):
    c = self.cuda
    self.check(c.cuCtxSetCurrent(self.dev.context))
    self.check(c.cuMemcpyDtoHAsync_v2(self.ct.c_void_p(self.host.value), c.CUdeviceptr_v2(self.tok_ptr + 4 * pos), 4, None))
    self.check(c.cuEventRecord(self.event, None))
  def wait(self) -> int:
    self.check(self.cuda.cuEventSynchronize(self.event))
    return self.ct.c_int32.from_address(self.host.value).value
