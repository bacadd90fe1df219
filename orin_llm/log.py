"""Logging for people: one-line messages and progress on stderr (stdout carries only generated text)."""
from __future__ import annotations
import logging, sys, time

logger = logging.getLogger("orin_llm")

def setup(level: int = logging.INFO):
  if not logger.handlers:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("orin-llm: %(message)s"))
    logger.addHandler(h)
  logger.setLevel(level)

def info(msg: str, *args): logger.info(msg, *args)

_last = [0.0]
def progress(what: str, done: int, total: int, t0: float):
  """A progress line on a terminal (rewritten in place), a few lines otherwise."""
  now = time.monotonic()
  if done < total and now - _last[0] < 0.5: return
  _last[0] = now
  if not logger.isEnabledFor(logging.INFO): return
  msg = f"{what}: {done}/{total} ({now - t0:.1f} s)"
  if sys.stderr.isatty(): print(f"\rorin-llm: {msg}", end="\n" if done >= total else "", file=sys.stderr, flush=True)
  elif done >= total: logger.info(msg)
