#!/usr/bin/env python3
"""Per-kernel breakdown of one decode step: runs the step uncompiled with tinygrad's DEBUG=2 timing
(each kernel synchronized and timed alone) and prints the kernels by time with their bytes and GB/s.
  profile_decode.py MODEL [--context N] [--pos P] [--max-batch B] [--batch R | --chunk T | --verify K | --group]
--batch R: the batched step of R rows (every row at P), as the server runs R requests at once.
--verify K: speculative decoding's verify step of K rows of one sequence from P (K one of engine.VERIFY_SIZES).
--chunk T: a prefill chunk of T prompt tokens from position P (T one of the engine's chunk sizes).
--group [B]: the step that prefills the prompts of slots 0..B-1 at once (engine.Steps.group; B one of the batch sizes,
default max-batch): group_rows tokens of each from position P, all real (clients that arrive together, short prompts).
--graph N (with --chunk or --group): first, the compiled step's wall time as the server runs it (the prompt's tokens
from P, the first token read), median of N."""
import argparse
from orin_llm import settings
settings.search_defaults()  # a BEAM run searches as the server does (from the hand-coded opts, small kernels skipped, seeds)
from tinygrad.helpers import Context
from orin_llm.engine import Engine
from kernel_times import kernel_times, print_table

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--context", type=int, default=704)  # the bench's context: same kernels, so BEAM results are reused
ap.add_argument("--pos", type=int, default=100); ap.add_argument("--top", type=int, default=25)
ap.add_argument("--max-batch", type=int, default=4, help="slots, as the server's and the bench's: the same kernels")
ap.add_argument("--batch", type=int, default=1, help="rows of the batched step to profile (1: the single-sequence step)")
ap.add_argument("--chunk", type=int, default=0, help="profile a prefill chunk of this many rows from --pos instead")
ap.add_argument("--verify", type=int, default=0, help="profile the verify step of this many rows from --pos instead")
ap.add_argument("--group", type=int, nargs="?", const=-1, default=0, help="profile the step that prefills the prompts of this many slots (default max-batch) together instead")
ap.add_argument("--compare", type=int, default=0, help="time each kernel with the hand-coded opts and with this BEAM width's results, paired")
ap.add_argument("--graph", type=int, default=0, help="with --chunk or --group: also time the compiled step this many times, as the server runs it")
a = ap.parse_args()
eng = Engine(a.model, max_context=a.context, max_batch=a.max_batch)
if a.pos:
  with Context(BEAM=0): eng.forward(list(range(1, a.pos + 1)), 0)  # fill the cache; these concrete shapes need no search
if a.chunk:  # the chunk step's model (engine.Steps.chunk) over prompt tokens from --pos, its variables bound as it binds them
  from orin_llm.model import Rows
  assert a.chunk in eng.chunks, f"--chunk {a.chunk}: the engine's chunk sizes are {eng.chunks}"
  assert a.pos + a.chunk <= eng.max_context, "--pos + --chunk past the context"
  st, T = eng.state, a.chunk
  def step():
    pos = eng.v_pos.bind(a.pos)
    return st.logits[0:1].assign(eng.model(st.prompt[pos:pos + T], Rows((pos,), T, eng.v_slot.bind(0)), eng.v_len.bind(T))).realize()
elif a.verify:  # the verify step's model (engine.Steps.verify): K rows of one sequence from --pos, every row's logits
  from orin_llm.engine import VERIFY_SIZES
  from orin_llm.model import Rows
  assert a.verify in VERIFY_SIZES, f"--verify {a.verify}: the engine compiles verify steps of {VERIFY_SIZES} rows"
  assert a.pos + a.verify <= eng.max_context, "--pos + --verify past the context"
  st, K = eng.state, a.verify
  def step():
    pos = eng.v_pos.bind(a.pos)
    return st.logits[0:K].assign(eng.model(st.prompt[pos:pos + K], Rows((pos,), K, eng.v_slot.bind(0)), all_rows=True)).realize()
elif a.group:  # the group step's model (engine.Steps.group), its variables bound as prefill_together binds them
  from orin_llm.model import Rows, key_block
  st, B, G = eng.state, (eng.max_batch if a.group < 0 else a.group), eng.group_rows
  assert B in eng.batch_sizes, f"--group {B}: the engine's batch sizes are {eng.batch_sizes} (--max-batch 2 or more)"
  def step():
    size = key_block(G, B)
    rows = Rows(tuple(v.bind(a.pos) for v in eng.v_rows[:B]), G, 0, eng.v_group_blocks.bind((a.pos + G + size - 1) // size))
    return st.logits[0:B].assign(eng.model(st.group[0:B].reshape(-1), rows, n=tuple(v.bind(G) for v in eng.v_lens[:B]))).realize()
elif a.batch == 1: step = lambda: eng.profile_step().realize()  # the same kernels as the compiled step
else:  # the batch step's model (engine.Steps.batch), its symbolic positions bound as the compiled step binds them
  from orin_llm.model import Rows, ROW_BLOCK
  assert a.batch in eng.batch_sizes, f"--batch {a.batch}: the engine compiles batches of {eng.batch_sizes}"
  st, B = eng.state, a.batch
  rows = lambda: Rows(tuple(v.bind(a.pos) for v in eng.v_rows[:B]), 1, 0, eng.v_blocks.bind((a.pos + ROW_BLOCK) // ROW_BLOCK))
  step = lambda: st.logits[0:B].assign(eng.model(st.next_tok[0:B], rows())).realize()
if a.graph and (a.chunk or a.group):  # the compiled step as the server runs it: its wall time with the first tokens read
  import time, numpy as np
  from orin_llm.sampling import Sampling
  T = a.chunk or eng.group_rows
  slots = [0] if a.chunk else list(range(eng.max_batch if a.group < 0 else a.group))
  prompts = {b: np.random.default_rng(b).integers(0, eng.cfg.vocab_size, a.pos + T).tolist() for b in slots}
  def served():
    for b, p in prompts.items(): eng.slots[b].cached, eng.slots[b].next = p[:a.pos], None  # the first pos tokens cached
    t0 = time.perf_counter()
    if a.chunk:
      for _ in eng.prefill_chunks(0, prompts[0], Sampling()): pass
    else: eng.prefill_together({b: (p, Sampling()) for b, p in prompts.items()})
    [eng.first_token(b) for b in slots]
    return time.perf_counter() - t0
  times = [served() for _ in range(a.graph + 2)][2:]  # the first two capture the step
  print(f"compiled step, {'one prompt' if a.chunk else f'{len(slots)} prompts'} of {T} tokens at {a.pos}, first tokens read: "
        f"median {np.median(times) * 1e3:.2f} ms [{min(times) * 1e3:.2f}, {max(times) * 1e3:.2f}] over {a.graph}")
what = (f"one prefill chunk of {a.chunk} at {a.pos}" if a.chunk else f"a verify step of {a.verify} at {a.pos}" if a.verify else f"{eng.max_batch if a.group < 0 else a.group} prompts' {eng.group_rows} tokens each at {a.pos}"
        if a.group else f"a batch step of {a.batch} at {a.pos}" if a.batch > 1 else f"one decode step at {a.pos}")
if a.compare:
  from kernel_times import print_compare
  with Context(BEAM=0): step()
  with Context(BEAM=a.compare): step()
  runs = []
  for _ in range(3):  # interleaved, each kernel's least of three: a clock or a neighbour that slows one run does not decide
    with Context(BEAM=0): b = kernel_times(step, args=True)
    with Context(BEAM=a.compare): runs.append((b, kernel_times(step, args=True)))
  print_compare(runs, what, a.top)
  raise SystemExit(0)
if a.top == 0: raise SystemExit(0)  # --top 0: the compiled step's time (--graph) alone
step()  # compile everything once
print_table(kernel_times(step), what, a.top)
