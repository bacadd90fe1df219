"""The engine thread. The engine is not thread-safe, so one thread loads it, warms it up and runs every
generation. It schedules continuously, as llama.cpp's server does with its slots: waiting jobs (in arrival order,
from a bounded queue) take free KV-cache slots (the one holding the longest prefix of their prompt), and each tick
of the loop runs a prefill chunk of each joining job and then one batched decode round (a few steps queued back to
back) for every slot that is generating; the short prompts of jobs that join together run as one step over the
first slots, as many as the smallest batch size that holds theirs (engine.prefill_together). A finished or cancelled job leaves its slot at once; the cancel flag (set
when the client goes away) is checked between prefill chunks and between decode rounds. Results go back to the
request's asyncio task through its event loop."""
from __future__ import annotations
import asyncio, contextlib, logging, queue, threading, time
from dataclasses import dataclass, field
from orin_llm.sampling import Sampling
from orin_llm.server.metrics import Metrics

logger = logging.getLogger("orin_llm.server")

class StopText:
  """Detokenizes a stream of ids and cuts it at the first stop string. Text that might be the start
  of a stop string is held back until the next tokens decide, so a stop string never leaks out."""
  def __init__(self, tok, stops: list[str]):
    self.dec, self.stops, self.held = tok.stream(), [s for s in stops if s], ""
  def push(self, tid: int) -> tuple[str, bool]:
    self.held += self.dec.push(tid)
    return self._release(False)
  def flush(self) -> str:
    self.held += self.dec.flush()
    return self._release(True)[0]
  def _release(self, final: bool) -> tuple[str, bool]:
    hits = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
    if hits:
      out, self.held = self.held[:min(hits)], ""
      return out, True
    keep = 0 if final else max((k for s in self.stops for k in range(min(len(s) - 1, len(self.held)), 0, -1)
                                if self.held.endswith(s[:k])), default=0)
    out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
    return out, False

@dataclass(eq=False)
class Job:
  prompt: list[int]
  max_new: int
  sampling: Sampling
  stop: list[str]
  loop: asyncio.AbstractEventLoop
  events: asyncio.Queue = field(default_factory=asyncio.Queue)
  cancelled: threading.Event = field(default_factory=threading.Event)
  arrived: float = field(default_factory=time.monotonic)
  received: float | None = None  # when the server began to read the request (before its body, template, tokens)
  speculative: bool = True  # may run speculative decoding when the server has it on and the job generates alone
  constraint: object = None  # structured.Constraint: the grammar the output follows (the engine masks its choices)
  worker: Worker | None = None
  _held: list | None = field(default=None, repr=False)  # events held back by held(), posted together when it ends
  def cancel(self):
    """Stops the job between two steps, or keeps it from starting; a no-op once it is done."""
    self.cancelled.set()
    if self.worker is not None: self.worker._unqueue(self)
  def emit(self, *event):
    if self._held is not None: self._held.append(event)
    else: self._post([event])
  @contextlib.contextmanager
  def held(self):
    """The events emitted inside reach the event loop together, in one wake-up of its thread: a decode round's
    tokens of a job, rather than a wake-up (a write to the loop's pipe, a turn of the loop) a token. At 8 streams a
    round of 8 steps made 64 wake-ups that held the GIL while the device ran one step ahead (docs/PERF.md)."""
    outer, self._held = self._held, self._held if self._held is not None else []
    try: yield
    finally:
      if outer is None:
        events, self._held = self._held, None
        if events: self._post(events)
  def _post(self, events: list):
    try: self.loop.call_soon_threadsafe(_put_all, self.events, events)
    except RuntimeError: self.cancelled.set()  # the loop is closed: nobody is listening

def _put_all(q: asyncio.Queue, events: list):
  for e in events: q.put_nowait(e)

# Clients that send together: the first one's job reaches an idle engine while the server still reads the others' requests
# (their bodies, templates, tokens), so its prompt's chunk runs alone and theirs wait for it: with 4 clients their time
# to the first token was 9.3 ms at the median, its queued phase 2.9 ms, against 4.4 and 0.2 for a lone client (1B Q6_K,
# H100, docs/PERF.md, fifty-second session). The config key gather_ms (Worker's gather, in seconds): how long an idle
# engine that has taken a job waits for the generation requests being read at that moment, so that their prompts run
# in one step with its; a lone client's request has none beside it and waits for nothing (unless another request's
# body is still arriving, or being tokenized: then up to the bound, at most 100 ms).
class Reading:
  """A generation request the server is reading (Worker.reading counts them): from its handler's start until its job
  is queued (done(), called by the handler right after Worker.submit) or the handler ends without one."""
  def __init__(self, worker: Worker):
    self.worker, self.open = worker, True
    worker.reading += 1
  def done(self):
    if self.open: self.open, self.worker.reading = False, self.worker.reading - 1
  def __enter__(self): return self
  def __exit__(self, *exc): self.done()

class QueueFull(Exception):
  def __init__(self, retry_after: int): self.retry_after = retry_after

@dataclass(eq=False)
class Run:
  """A job in a slot: its prefill (chunks left to run) or its decoding."""
  job: Job
  slot: int
  text: StopText
  prefill: object = None  # the engine's prefill_chunks iterator while chunks are left
  n: int = 0  # tokens produced
  first: float | None = None
  started: float = field(default_factory=time.monotonic)  # when it took its slot
  reused: int = 0  # prompt tokens its slot held already (prefix reuse): not run again
  spec: object = None  # its speculative.Speculator, made when it first generates alone
  failed: Exception | None = None  # its constraint failed (the grammar allows nothing): the job fails, the others go on

def timings(r: Run, end: float) -> dict:
  """Where a request's time went, in milliseconds, under llama-server's names (its `timings` object) where they exist:
  request_ms (reading the request, its template and tokens, until it was queued), queued_ms (waiting for a slot and
  the engine's next tick), prompt_ms (from its slot to its first token chosen: its prompt's chunks, and the others'
  work it waited behind), predicted_ms (first token to last). prompt_n: the prompt tokens run (those its slot held
  already were not: prefix reuse); predicted_n: the tokens generated. The client's time to its first token is
  request_ms + queued_ms + prompt_ms plus the way back."""
  j, ms = r.job, lambda a, b: round((b - a) * 1e3, 3)
  first = r.first if r.first is not None else end
  out = {"request_ms": ms(j.received, j.arrived) if j.received is not None else None, "queued_ms": ms(j.arrived, r.started),
         "prompt_n": len(j.prompt) - r.reused, "prompt_ms": ms(r.started, first), "predicted_n": r.n, "predicted_ms": ms(first, end)}
  if r.n > 1 and end > first: out["predicted_per_second"] = round((r.n - 1) / (end - first), 3)
  return out

class Scheduler:
  """Slots, the runs in them, and one tick of work (see the module's docstring)."""
  def __init__(self, engine, tok, metrics: Metrics, lookahead: int):
    self.eng, self.tok, self.m, self.lookahead = engine, tok, metrics, lookahead
    self.spec_factory = getattr(engine, "speculator", None)  # makes a speculative.Speculator (None: the server does not speculate)
    self.runs: dict[int, Run] = {}
    from orin_llm.engine import SMALL_CHUNK_MAX  # here: the engine (tinygrad) is imported once the settings are applied
    self.long_chunk = SMALL_CHUNK_MAX

  def free_slots(self) -> list[int]: return [s for s in range(self.eng.max_batch) if s not in self.runs]
  def busy(self) -> bool: return bool(self.runs)

  def admit(self, job: Job):
    """job takes the free slot that holds the longest prefix of its prompt (the lowest of equals)."""
    slot = max(self.free_slots(), key=lambda s: (self.eng.common_prefix(s, job.prompt), -s))
    job.emit("start")
    # what prefill_chunks will not run again (it runs the prompt's last token in any case)
    reused = min(self.eng.common_prefix(slot, job.prompt), len(job.prompt) - 1)
    r = self.runs[slot] = Run(job, slot, StopText(self.tok, job.stop), reused=reused)
    if job.constraint is None: r.prefill = self.eng.prefill_chunks(slot, job.prompt, job.sampling)
    else: r.prefill = self.eng.prefill_chunks(slot, job.prompt, job.sampling, mask=lambda: self._mask(r))
    self.m.slots_active.set(len(self.runs))

  def tick(self, waiting: bool, join=None):
    """A prefill chunk of each joining job (oldest first, until one runs a long chunk), then one decode round for
    every generating slot. Clients that arrive together each get their first token after their own short prompt's
    chunk and those before it, not after theirs and a decode round for each job before them (read once the next
    joining step is queued, see below). waiting: jobs wait for
    a slot, so the round is kept short and they join sooner. join(): admits the jobs queued since (while slots are
    free) and says whether jobs still wait; called after the chunks, so that jobs which arrived during them take
    their chunk in this tick too, before the round. Clients that send together reach the queue a few milliseconds
    apart: the first one's chunk ran alone, then a round of DEFAULT_LOOKAHEAD steps, and only then the others'
    chunks (4 clients: time to the first token 24.9 ms at the median against 5.5 alone, 1B on an H200)."""
    for r in list(self.runs.values()):
      if r.job.cancelled.is_set(): self._finish(r, "cancelled")
    # prompts completed by the step queued last: their first tokens are fetched behind it (engine.fetch_first) and read
    # once the next step is queued, so that the device runs the prompts of jobs that joined meanwhile while the host
    # waits. Clients that send together reach the engine's queue 0.3-1.3 ms after the first one's job is taken, while its
    # step runs (1B, H100: docs/PERF.md, fifty-sixth session): their step then follows it on the device without the
    # host's read of the first one's token, its events and their step's queueing in between.
    held: list[Run] = []
    def queued(done: list[Run]):
      nonlocal held
      if held: self._read_first(held)
      held = done
      if done: self.eng.fetch_first([r.slot for r in done])
    ran, long = set(), False
    while not long:
      joining = sorted((r for r in self.runs.values() if r.prefill is not None and r not in ran), key=lambda r: r.job.arrived)
      if not joining: break
      together = self._together(joining)
      if together:  # short prompts of several jobs: their next tokens in one step, the weights read once for all
        ran.update(together)
        queued(self._prefill_together(together))
        joining = [r for r in joining if r not in together]
      for r in joining:  # a chunk each, oldest first; a prompt's last chunk also queues the choice of its first token
        ran.add(r)
        if r.job.constraint is not None: queued([])  # its first mask (a grammar's, possibly milliseconds) is not waited for
        before = len(self.eng.slots[r.slot].cached)
        next(r.prefill, None)
        done = len(self.eng.slots[r.slot].cached)
        if done == len(r.job.prompt): r.prefill = None
        queued([r] if r.prefill is None else [])
        if done - before > self.long_chunk:  # a long chunk ran (~28 ms, 1B on an H100): the generating slots go next
          long = True
          break
      if join is not None: waiting = join()
    queued([])
    gen = [r for r in self.runs.values() if r.prefill is None]
    if not gen: return
    busy = waiting or any(r.prefill is not None for r in self.runs.values())
    room = min(self.eng.max_context - 1 - len(self.eng.slots[r.slot].cached) for r in gen)
    if len(gen) == 1 and self._speculate(gen[0], room, busy): return
    spec = gen[0].spec if len(gen) == 1 and not busy else None  # a lone job that speculates: plain rounds in its stretches
    # rounds of 2 while a stream is young (fewer tokens than a round of lookahead): clients that send together reach the
    # queue milliseconds apart, and one that came after join() waited for the first one's whole round before its prompt
    # ran (a round of 8 steps: ~10 ms of the 1B on an H200; 4 clients' first token 14.7 ms at the median against 4.8 alone,
    # docs/PERF.md twenty-sixth session). The next round is still queued ahead of the host's read when no job waits.
    young = any(r.n < self.lookahead for r in gen)
    n = max(1, min(2 if busy or young else spec.stretch(self.lookahead) if spec is not None else self.lookahead,
                   max(r.job.max_new - r.n for r in gen), room))
    # constrained runs: a round of one token, whose masks the host computes while the model step runs
    cons = [r for r in gen if r.job.constraint is not None]
    if cons: n = 1
    # the next round's model step queued before this round's tokens are read (engine.decode's ahead) unless a job joins
    # or waits: wasted (a decode step's time) only where a verify step follows
    ahead = not busy
    t0 = time.monotonic()
    if cons: out = self.eng.decode([r.slot for r in gen], n, masks=lambda: {r.slot: self._mask(r) for r in cons}, ahead=ahead)
    else: out = self.eng.decode([r.slot for r in gen], n, ahead=ahead)
    self.m.batch_rows.observe(len(gen))
    for j, r in enumerate(gen): self._emit(r, out[:, j].tolist())
    self.m.step_seconds.observe((time.monotonic() - t0) / n)
    if len(gen) == 1 and gen[0].spec is not None: gen[0].spec.rested(n)

  def _together(self, joining: list[Run]) -> list[Run]:
    """The joining runs that take one step together (engine.prefill_together): two or more whose prompts have at most
    long_chunk tokens left to run (longer ones start alone, in long chunks), unconstrained (a constrained job's first
    choice is masked: its own chunks). Where the engine has no such step (one slot), none."""
    if not getattr(self.eng, "group_rows", 0): return []
    runs = [r for r in joining if r.job.constraint is None
            and len(r.job.prompt) - min(self.eng.common_prefix(r.slot, r.job.prompt), len(r.job.prompt) - 1) <= self.long_chunk]
    return runs if len(runs) > 1 else []

  def _prefill_together(self, runs: list[Run]) -> list[Run]:
    """Queues the step of these runs' next tokens; returns those whose prompts it completes."""
    got = self.eng.prefill_together({r.slot: (r.job.prompt, r.job.sampling) for r in runs})
    done = []
    for r in runs:
      if got[r.slot] == len(r.job.prompt):
        r.prefill = None
        done.append(r)
      else:  # a fresh iterator, should the job go on alone: it starts from what the slot caches now
        r.prefill = self.eng.prefill_chunks(r.slot, r.job.prompt, r.job.sampling)
    return done

  def _read_first(self, runs: list[Run]):
    """Waits for the first tokens fetched for these runs and hands each to its job."""
    first = self.eng.read_first()
    for r in runs: self._emit(r, [first[r.slot]])

  def _mask(self, r: Run):
    """r's next bitmask; a constraint that fails fails its job alone (the row chooses freely, and is dropped)."""
    try: return None if r.failed else r.job.constraint.mask_words()
    except Exception as e:
      r.failed = e
      return None

  def _speculate(self, r: Run, room: int, busy: bool) -> bool:
    """A job generating alone: a verify step over proposals for its next tokens, when the server speculates, the
    job allows it and proposals are found. Whether it ran."""
    if self.spec_factory is None or not r.job.speculative or busy or r.job.constraint is not None: return False
    if r.spec is None: r.spec = self.spec_factory()
    if r.spec.cost is None: r.spec.cost = self.eng.verify_costs(r.slot)
    s = self.eng.slots[r.slot]
    k = min(r.spec.want(), room - 1, r.job.max_new - r.n - 1)
    if k <= 0: return False
    props = r.spec.source.propose(s.cached + [s.next], k)[:k]
    if not props: return False
    out = self.eng.verify(r.slot, props)
    r.spec.update(len(props), len(out) - 1)
    self.m.spec_proposed.inc(len(props)); self.m.spec_accepted.inc(len(out) - 1); self.m.spec_steps.inc()
    self._emit(r, out)
    return True

  def _emit(self, r: Run, ids: list[int]):
    """Hands tokens to the job until it ends (stop token or string, max_tokens, the context's end); their events
    (and its end's) reach the event loop together."""
    with r.job.held(): self._emit_held(r, ids)

  def _emit_held(self, r: Run, ids: list[int]):
    for tid in ids:
      done = False
      if r.job.constraint is not None:
        try:
          if r.failed: raise r.failed
          done = r.job.constraint.advance(tid)
        except Exception as e:
          logger.warning(f"constrained decoding failed: {e}")
          r.job.emit("error", f"generation failed: {e}")
          return self._finish(r, "error", flush=False, emit=False)
      r.n += 1
      if r.first is None:
        r.first = time.monotonic()
        self.m.ttft.observe(r.first - r.job.arrived)
      if tid in self.tok.stop_ids: return self._finish(r, "stop")
      piece, hit = r.text.push(tid)
      if piece: r.job.emit("text", piece)
      if hit: return self._finish(r, "stop", flush=False)
      if done: return self._finish(r, "stop")  # the grammar is complete
      if r.n >= r.job.max_new or len(r.job.prompt) + r.n >= self.eng.max_context: return self._finish(r, "length")

  def _finish(self, r: Run, finish: str, flush: bool = True, emit: bool = True):
    if self.runs.get(r.slot) is not r: return
    del self.runs[r.slot]
    if r.job.constraint is not None: self.eng.set_mask(r.slot, None)
    if flush and finish != "cancelled" and (piece := r.text.flush()): r.job.emit("text", piece)  # held back for a stop string
    end, m = time.monotonic(), self.m
    m.prompt_tokens.inc(len(r.job.prompt)); m.generated_tokens.inc(r.n)
    if r.first is not None and r.n > 1 and end > r.first: m.decode_rate.observe((r.n - 1) / (end - r.first))
    m.slots_active.set(len(self.runs))
    if emit: r.job.emit("end", finish, {"prompt_tokens": len(r.job.prompt), "completion_tokens": r.n, "total_tokens": len(r.job.prompt) + r.n},
                        timings(r, end))

  def fail(self, e: Exception):
    """An engine failure fails the requests it was running, not the server; the slots start afresh."""
    for r in list(self.runs.values()):
      r.job.emit("error", f"generation failed: {type(e).__name__}: {e}")
      del self.runs[r.slot]
    self.eng.reset()  # the caches may be half-written
    self.m.slots_active.set(0)

class Worker:
  """States: loading -> warming -> ready (-> stopping), or error (failure holds the exception)."""
  def __init__(self, load, queue_size: int, metrics: Metrics, on_status=lambda state, text: None, lookahead: int | None = None,
               gather: float = 0.0):
    self._load, self.metrics, self.on_status = load, metrics, on_status
    # the queue is unbounded; the bound is on live waiting jobs, so that a job whose client left
    # gives its place back at once rather than when the thread gets to it
    self.queue: queue.Queue[Job | None] = queue.Queue()
    self.queue_size, self.waiting, self._lock = queue_size, set(), threading.Lock()
    self.state, self.failure = "loading", None
    self.engine = self.tok = self.sched = None
    self.lookahead = lookahead
    self.ready_counts: dict | None = None  # kernel cache counts at READY: /health reports what changed since
    self.heartbeat = time.monotonic()
    self.avg_seconds = 5.0  # running mean of a job's duration, for Retry-After
    # generation requests being read (Reading; changed on the event loop's thread alone, read by the engine's) and how
    # long an idle engine waits for them after taking a job, in seconds (the config key gather_ms)
    self.reading, self.gather = 0, gather
    self._stop = threading.Event()
    self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

  def start(self): self.thread.start()
  def stop(self):
    self._stop.set()
    self.queue.put_nowait(None)  # wakes the thread at once

  def alive(self, max_age: float) -> bool:
    """The loop is running: the thread lives and, once serving, has beaten within max_age seconds
    (it beats at least every half second when idle and at every tick when busy)."""
    if not self.thread.is_alive(): return False
    return self.state in ("loading", "warming") or time.monotonic() - self.heartbeat < max_age

  def kernel_counts(self) -> dict | None:
    """The kernel cache's path and lookups so far (kernel_cache.Counter), None when the engine uses none."""
    if self.engine is None or getattr(self.engine, "kernel_db", None) is None: return None
    from orin_llm.kernel_cache import COUNTER
    return COUNTER.snapshot()

  def _kernels(self) -> str:
    k = self.kernel_counts()
    return "" if k is None else f"; kernels: {k['hits']} from the cache, {k['compiled']} compiled, {k['searched']} BEAM-searched"

  def depth(self) -> int: return len(self.waiting)
  def slots(self) -> int: return self.engine.max_batch if self.engine is not None else 1

  def submit(self, job: Job):
    # a free slot takes a job at the engine thread's next tick: jobs that arrive together (clients started at once)
    # wait there until then, and only what will not find a slot is held against queue_size (read without the
    # engine thread's lock: a job between the queue and its slot makes the bound one more for that moment)
    free = len(self.sched.free_slots()) if self.sched is not None else 0
    with self._lock:
      if len(self.waiting) >= self.queue_size + free:
        raise QueueFull(max(1, min(60, round(self.avg_seconds * (len(self.waiting) + 1) / self.slots()))))
      job.worker = self
      self.waiting.add(job)
      self.queue.put_nowait(job)
    self.metrics.queue_depth.set(len(self.waiting))

  def _unqueue(self, job: Job):
    with self._lock: self.waiting.discard(job)
    self.metrics.queue_depth.set(len(self.waiting))

  def _set(self, state: str, status: str):
    self.state = state
    logger.info(status)
    self.on_status(state, status)

  def _run(self):
    try:
      self._set("loading", "loading the model")
      self.engine, self.tok = self._load()
      self._set("warming", "warming up: running the loaded prefill and decode steps" if getattr(self.engine, "steps_file", None) else
                           "warming up: compiling the prefill and decode steps")
      t0 = time.monotonic()
      self._warm_up()
      self._set("ready", f"ready (warm-up took {time.monotonic() - t0:.1f} s{self._kernels()})")
      self.ready_counts = self.kernel_counts()
      self.metrics.ready.set(1)
    except BaseException as e:
      self.failure, self.state = e, "error"
      self.on_status("error", f"failed: {e}")
      return
    from orin_llm.engine import DEFAULT_LOOKAHEAD
    self.sched = sched = Scheduler(self.engine, self.tok, self.metrics, self.lookahead or DEFAULT_LOOKAHEAD)
    while not self._stop.is_set():
      self.heartbeat = time.monotonic()
      if not self._join(sched, idle_wait=True): return
      if not sched.busy(): continue
      self.metrics.busy.set(1)
      before = self.kernel_counts()
      try: sched.tick(waiting=bool(self.waiting), join=lambda: self._join(sched) and bool(self.waiting))
      except Exception as e:
        logger.exception("generation failed")
        sched.fail(e)
      finally:
        if before is not None and (n := self.kernel_counts()["misses"] - before["misses"]):
          logger.info(f"kernel cache: a step compiled or searched {n} kernels (not in {before['path']}; run orin-llm prewarm)")
      if not sched.busy():
        self.metrics.busy.set(0)

  def _join(self, sched: Scheduler, idle_wait: bool = False) -> bool:
    """Queued jobs take the free slots (an idle engine waits up to half a second for one, when idle_wait, and after
    taking it up to self.gather for the requests being read then); False once stop()'s wake-up came."""
    until = None  # the end of the wait for the requests being read beside a job an idle engine took
    gathering = lambda: until is not None and self.reading > 0 and time.monotonic() < until
    while sched.free_slots():
      idle = idle_wait and not sched.busy()
      try:
        if idle: job = self.queue.get(timeout=0.5)
        elif gathering(): job = self.queue.get(timeout=min(max(until - time.monotonic(), 0.0), 0.0005))
        else: job = self.queue.get_nowait()
      except queue.Empty:
        if gathering(): continue
        break
      if job is None: return False
      self._unqueue(job)
      if job.cancelled.is_set(): continue  # its client left while it waited
      if idle and self.gather: until = time.monotonic() + self.gather
      sched.admit(job)
    return True

  def _warm_up(self):
    from orin_llm.warmup import warm_up  # the routine `orin-llm prewarm` fills the kernel cache with
    warm_up(self.engine, beat=lambda: setattr(self, "heartbeat", time.monotonic()))
