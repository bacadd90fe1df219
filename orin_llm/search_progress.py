"""Progress of compiling and BEAM-searching kernels, for `orin-llm prewarm`: kernels done / total of the batch
tinygrad is lowering (one `realize.lower_and_compile` call: the kernels of a step that are not compiled in
this process yet), the time spent on it and an estimate of the time left (the batch's mean time per kernel
so far times the kernels left: rough, as a searched kernel takes far longer than a small one). On a terminal
one line on stderr, rewritten in place; otherwise (the journal, under systemd) a log line every `interval`
seconds while a batch runs and one when it ends.

Nothing runs in a thread (a thread holding a lock while a worker pool forks is what hung a prewarm, issue
25): the line is refreshed from tinygrad's own calls, each kernel done (the progress bar lower_and_compile
keeps, `realize.tqdm`, which it shows itself only with DEBUG>=1) and each BEAM candidate timed
(`search._time_program`). A batch lowered while another is open (tinygrad realizes a buffer to clear caches
while timing) is not shown."""
from __future__ import annotations
import logging, sys, time

logger = logging.getLogger("orin_llm")

def _dur(s: float) -> str:
  s = int(round(s))
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"

class Progress:
  def __init__(self, stream=None, tty: bool | None = None, interval: float = 30.0, refresh: float = 0.25, clock=time.monotonic):
    self.stream, self.clock, self.interval, self.refresh = stream, clock, interval, refresh
    self._tty = tty
    self.batches = 0
    self.bar = None  # tinygrad's progress bar of the open batch
    self.t0 = self.last = 0.0

  @property
  def out(self): return self.stream if self.stream is not None else sys.stderr
  @property
  def tty(self) -> bool:
    if self._tty is not None: return self._tty
    try: return self.out.isatty()
    except (AttributeError, ValueError): return False

  def open(self, bar) -> bool:
    """A batch starts (bar.t kernels); False while another is open."""
    if self.bar is not None: return False
    self.bar, self.batches = bar, self.batches + 1
    self.t0 = self.last = self.clock()
    return True

  def message(self, done: int, total: int, now: float) -> str:
    el = now - self.t0
    msg = f"kernels {done}/{total} (batch {self.batches}), {_dur(el)}"
    if 0 < done < total: msg += f", about {_dur(el / done * (total - done))} left"
    try:
      from tinygrad.engine import worker
      if (n := getattr(worker, "stalled_pools", 0)): msg += f", {n} stalled worker pool{'s' if n > 1 else ''} replaced"
    except ImportError: pass
    return msg

  def update(self, bar, close: bool = False):
    """The batch's bar moved (a kernel done) or closed; a tick (bar None) refreshes the line."""
    if bar is None: bar = self.bar
    if bar is None or bar is not self.bar: return
    now = self.clock()
    if close:
      self.bar = None
      if self.tty: self._write(self.message(bar.n, bar.t, now), end=True)
      elif now - self.t0 >= 1.0: logger.info("prewarm: " + self.message(bar.n, bar.t, now))
      return
    if now - self.last < (self.refresh if self.tty else self.interval): return
    self.last = now
    if self.tty: self._write(self.message(bar.n, bar.t, now))
    else: logger.info("prewarm: " + self.message(bar.n, bar.t, now))

  def _write(self, msg: str, end: bool = False):
    self.out.write(f"\rorin-llm: prewarm: {msg}\033[K" + ("\n" if end else ""))
    self.out.flush()

PROGRESS: Progress | None = None

def install(progress: Progress | None = None) -> Progress:
  """Shows progress from now on (once per process; a later call replaces the Progress shown)."""
  global PROGRESS
  first, PROGRESS = PROGRESS is None, progress or Progress()
  if first:
    from tinygrad.engine import realize
    from tinygrad.codegen.opt import search
    base = realize.tqdm
    class Bar(base):  # what lower_and_compile counts its kernels with
      def __init__(self, *args, **kwargs):
        self._orin_open = False
        super().__init__(*args, **kwargs)
        self._orin_open = PROGRESS is not None and PROGRESS.open(self)
      def update(self, n: int = 0, close: bool = False):
        super().update(n, close)
        if getattr(self, "_orin_open", False) and PROGRESS is not None: PROGRESS.update(self, close)
    realize.tqdm = Bar
    orig_time = search._time_program
    def time_program(*args, **kwargs):
      if PROGRESS is not None: PROGRESS.update(None)
      return orig_time(*args, **kwargs)
    search._time_program = time_program
  return PROGRESS
