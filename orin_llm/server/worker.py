"""The engine thread. The engine is not thread-safe, so one thread loads it, warms it up and runs
every generation, taking jobs in arrival order from a bounded queue. Results go back to the
request's asyncio task through its event loop. Between tokens the thread checks the job's cancel
flag (set when the client goes away), so a dropped client frees the engine after one step."""
from __future__ import annotations
import asyncio, logging, queue, threading, time
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
  worker: Worker | None = None
  def cancel(self):
    """Stops the job between two tokens, or keeps it from starting; a no-op once it is done."""
    self.cancelled.set()
    if self.worker is not None: self.worker._unqueue(self)
  def emit(self, *event):
    try: self.loop.call_soon_threadsafe(self.events.put_nowait, event)
    except RuntimeError: self.cancelled.set()  # the loop is closed: nobody is listening

class QueueFull(Exception):
  def __init__(self, retry_after: int): self.retry_after = retry_after

class Worker:
  """States: loading -> warming -> ready (-> stopping), or error (failure holds the exception)."""
  def __init__(self, load, queue_size: int, metrics: Metrics, on_status=lambda state, text: None):
    self._load, self.metrics, self.on_status = load, metrics, on_status
    # the queue is unbounded; the bound is on live waiting jobs, so that a job whose client left
    # gives its place back at once rather than when the thread gets to it
    self.queue: queue.Queue[Job | None] = queue.Queue()
    self.queue_size, self.waiting, self._lock = queue_size, set(), threading.Lock()
    self.state, self.failure = "loading", None
    self.engine = self.tok = None
    self.ready_counts: dict | None = None  # kernel cache counts at READY: /health reports what changed since
    self.heartbeat = time.monotonic()
    self.avg_seconds = 5.0  # running mean of a job's duration, for Retry-After
    self._stop = threading.Event()
    self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

  def start(self): self.thread.start()
  def stop(self):
    self._stop.set()
    self.queue.put_nowait(None)  # wakes the thread at once

  def alive(self, max_age: float) -> bool:
    """The loop is running: the thread lives and, once serving, has beaten within max_age seconds
    (it beats at least every half second when idle and at every token when busy)."""
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

  def submit(self, job: Job):
    with self._lock:
      if len(self.waiting) >= self.queue_size: raise QueueFull(max(1, min(60, round(self.avg_seconds * (len(self.waiting) + 1)))))
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
    while not self._stop.is_set():
      self.heartbeat = time.monotonic()
      try: job = self.queue.get(timeout=0.5)
      except queue.Empty: continue
      if job is None: break
      self._unqueue(job)
      self._serve(job)

  def _warm_up(self):
    from orin_llm.warmup import warm_up  # the routine `orin-llm prewarm` fills the kernel cache with
    warm_up(self.engine, beat=lambda: setattr(self, "heartbeat", time.monotonic()))

  def _serve(self, job: Job):
    if job.cancelled.is_set(): return  # its client left while it waited
    before = self.kernel_counts()
    try: self._generate(job)
    finally:
      if before is not None and (n := self.kernel_counts()["misses"] - before["misses"]):
        logger.info(f"kernel cache: this request compiled or searched {n} kernels (not in {before['path']}; run orin-llm prewarm)")

  def _generate(self, job: Job):
    eng, tok, m = self.engine, self.tok, self.metrics
    job.emit("start")
    m.busy.set(1)
    t0 = time.monotonic()
    text, n, first, finish, hit = StopText(tok, job.stop), 0, None, "length", False
    try:
      for tid in eng.generate(job.prompt, job.max_new, job.sampling, tok.stop_ids):
        self.heartbeat = time.monotonic()
        n += 1
        if first is None:
          first = self.heartbeat
          m.ttft.observe(first - job.arrived)
        if tid in tok.stop_ids: finish = "stop"; break
        piece, hit = text.push(tid)
        if piece: job.emit("text", piece)
        if hit: finish = "stop"; break
        if job.cancelled.is_set(): finish = "cancelled"; break
      if not hit and (piece := text.flush()): job.emit("text", piece)  # text held back for a stop string that never came
    except Exception as e:  # an engine failure fails this request, not the server
      logger.exception("generation failed")
      eng.cached = []  # the cache may be half-written: start the next prompt from scratch
      job.emit("error", f"generation failed: {type(e).__name__}: {e}")
      return
    finally:
      end = time.monotonic()
      m.busy.set(0)
      m.prompt_tokens.inc(len(job.prompt)); m.generated_tokens.inc(n)
      if first is not None and n > 1 and end > first: m.decode_rate.observe((n - 1) / (end - first))
      self.avg_seconds = 0.8 * self.avg_seconds + 0.2 * (end - t0)
    job.emit("end", finish, {"prompt_tokens": len(job.prompt), "completion_tokens": n, "total_tokens": len(job.prompt) + n})
