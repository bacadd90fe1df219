"""settings.search_defaults() and orin_llm/search_progress.py: prewarm's BEAM settings and its progress line."""
import io, logging, os, subprocess, sys, textwrap, pathlib
from orin_llm import settings
from orin_llm.search_progress import Progress

ROOT = pathlib.Path(__file__).resolve().parent.parent

def test_search_defaults_keep_what_the_environment_sets(monkeypatch):
  for k in settings.SEARCH_DEFAULTS: monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("BEAM_MIN_US", "99")
  added = settings.search_defaults()
  assert os.environ["BEAM_MIN_US"] == "99" and "BEAM_MIN_US" not in added
  assert os.environ["BEAM_MP_CTX"] == "forkserver" and os.environ["BEAM_FROM_HEURISTIC"] == "1"
  assert set(added) == set(settings.SEARCH_DEFAULTS) - {"BEAM_MIN_US"}
  assert settings.search_defaults() == {}

class Clock:
  def __init__(self): self.t = 100.0
  def __call__(self): return self.t

class Bar:  # what Progress reads of tinygrad's tqdm: done and total
  def __init__(self, t): self.n, self.t = 0, t

def test_terminal_line_with_estimate():
  out, clock = io.StringIO(), Clock()
  p = Progress(stream=out, tty=True, clock=clock)
  bar = Bar(4)
  assert p.open(bar) and not p.open(Bar(1))  # a batch lowered inside another is not shown
  clock.t += 10; bar.n = 2; p.update(bar)
  clock.t += 0.1; p.update(None)  # a tick within the refresh interval: nothing
  clock.t += 5; p.update(None)  # a BEAM candidate timed: the line moves on
  clock.t += 5; bar.n = 4; p.update(bar, close=True)
  lines = out.getvalue().split("\r")[1:]
  assert lines == ["orin-llm: prewarm: kernels 2/4 (batch 1), 10s, about 10s left\033[K",
                   "orin-llm: prewarm: kernels 2/4 (batch 1), 15s, about 15s left\033[K",
                   "orin-llm: prewarm: kernels 4/4 (batch 1), 20s\033[K\n"], lines
  assert p.open(Bar(3)) and p.batches == 2

def test_log_lines_without_a_terminal(caplog):
  caplog.set_level(logging.INFO, logger="orin_llm")
  out, clock = io.StringIO(), Clock()
  p = Progress(stream=out, tty=False, interval=30, clock=clock)
  bar = Bar(10)
  p.open(bar)
  for _ in range(9):
    clock.t += 7; bar.n += 1; p.update(bar)  # every 30 s or more: a line
  clock.t += 7; bar.n += 1; p.update(bar, close=True)
  p.open(quick := Bar(2)); quick.n = 2; p.update(quick, close=True)  # under a second: no line
  msgs = [r.getMessage() for r in caplog.records]
  assert out.getvalue() == "" and msgs == ["prewarm: kernels 5/10 (batch 1), 35s, about 35s left",
                                            "prewarm: kernels 10/10 (batch 1), 1m10s"], msgs

# tinygrad's own lowering drives it: one batch per realize of new kernels, closed when all are compiled
LOWERING = textwrap.dedent("""
  from orin_llm import search_progress
  from tinygrad import Tensor
  events = []
  class Recording(search_progress.Progress):
    def open(self, bar):
      ok = super().open(bar); events.append(("open", bar.t, ok)); return ok
    def update(self, bar, close=False):
      if close: events.append(("close", bar.n, bar.t))
      super().update(bar, close)
  search_progress.install(Recording(tty=False))
  a = Tensor.rand(16, 16).realize()
  ((a @ a).relu() + a.sum()).realize()
  print(events)
""")

def test_install_follows_lowering():
  env = {**os.environ, "DEV": "CPU", "BEAM": "0", "PARALLEL": "0", "PYTHONPATH": str(ROOT)}
  r = subprocess.run([sys.executable, "-"], input=LOWERING, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  events = eval(r.stdout.strip().splitlines()[-1])
  opens, closes = [e for e in events if e[0] == "open"], [e for e in events if e[0] == "close"]
  assert len(opens) >= 2 and all(ok for _, _, ok in opens) and len(closes) == len(opens), events
  assert all(n == t for _, n, t in closes), events
