"""Logging for people: one-line messages and progress on stderr (stdout carries only generated text).
While an answer streams to a terminal, log lines wait until it ends (`held`): stderr and stdout share
the screen, and a line in the middle of the answer would split it."""
from __future__ import annotations
import contextlib, logging, sys, time

logger = logging.getLogger("orin_llm")

class _Hold(logging.Filter):
  """Keeps the records of the stderr handler while `held` is active; they are written when it ends."""
  def __init__(self):
    super().__init__()
    self.depth, self.records = 0, []
  def filter(self, record) -> bool:
    if self.depth: self.records.append(record); return False
    return True

_hold = _Hold()

def setup(level: int = logging.INFO):
  if not logger.handlers:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("orin-llm: %(message)s"))
    h.addFilter(_hold)
    logger.addHandler(h)
  logger.setLevel(level)

def info(msg: str, *args): logger.info(msg, *args)

def shares_screen() -> bool:
  """stdout and stderr are both terminals: what one writes lands between the other's lines."""
  try: return sys.stdout.isatty() and sys.stderr.isatty()
  except (AttributeError, ValueError): return False

@contextlib.contextmanager
def held(active: bool = True):
  """Log lines (of the handler setup() installs) and progress are kept while the block runs and written
  after it, on a line of their own."""
  if not active: yield; return
  _hold.depth += 1
  try: yield
  finally:
    _hold.depth -= 1
    if not _hold.depth and _hold.records:
      records, _hold.records = _hold.records, []
      sys.stdout.flush()
      for h in logger.handlers:
        if _hold in h.filters:
          for r in records: h.handle(r)

_last = [0.0]
def progress(what: str, done: int, total: int, t0: float):
  """A progress line on a terminal (rewritten in place), a few lines otherwise."""
  now = time.monotonic()
  if done < total and now - _last[0] < 0.5: return
  _last[0] = now
  if not logger.isEnabledFor(logging.INFO) or _hold.depth: return
  msg = f"{what}: {done}/{total} ({now - t0:.1f} s)"
  if sys.stderr.isatty(): print(f"\rorin-llm: {msg}", end="\n" if done >= total else "", file=sys.stderr, flush=True)
  elif done >= total: logger.info(msg)
