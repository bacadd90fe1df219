"""What `orin-llm serve` does differently under systemd than prewarm: BEAM workers never fork from the server
(a fork server, or spawn where asked), and the watchdog keeps being fed while the engine thread is inside a
kernel compile or BEAM search that makes progress."""
import logging, os, pathlib, subprocess, sys, threading, time

ROOT = pathlib.Path(__file__).resolve().parent.parent

def test_serve_spawns_beam_workers(monkeypatch, caplog):
  from orin_llm.server.cli import spawn_beam_workers
  monkeypatch.setenv("BEAM_MP_CTX", "fork")
  with caplog.at_level(logging.WARNING, logger="orin_llm.server"): spawn_beam_workers()
  assert os.environ["BEAM_MP_CTX"] == "forkserver"
  assert [r.getMessage() for r in caplog.records if "BEAM_MP_CTX=fork ignored" in r.getMessage()]
  caplog.clear()
  monkeypatch.delenv("BEAM_MP_CTX")
  spawn_beam_workers()
  assert os.environ["BEAM_MP_CTX"] == "forkserver" and not caplog.records  # the default: nothing to say
  monkeypatch.setenv("BEAM_MP_CTX", "spawn")
  spawn_beam_workers()
  assert os.environ["BEAM_MP_CTX"] == "spawn" and not caplog.records  # asked for, and safe: kept

class FakeWorker:
  def __init__(self, alive: bool):
    self.thread = threading.Thread(target=lambda: None)
    self._alive = alive
  def alive(self, max_age): return self._alive

def test_watchdog_fed_while_search_progresses(monkeypatch):
  from orin_llm.kernel_cache import COUNTER
  from orin_llm.server.cli import engine_alive
  stuck = FakeWorker(alive=False)  # no heartbeat for longer than max_age
  monkeypatch.setattr(stuck.thread, "is_alive", lambda: True)
  monkeypatch.setattr(COUNTER, "progress", time.monotonic() - 1.0)
  assert engine_alive(stuck, 30.0)  # inside a search that timed a candidate a second ago
  monkeypatch.setattr(COUNTER, "progress", time.monotonic() - 60.0)
  assert not engine_alive(stuck, 30.0)  # no progress either: wedged
  monkeypatch.setattr(COUNTER, "progress", time.monotonic())
  monkeypatch.setattr(stuck.thread, "is_alive", lambda: False)
  assert not engine_alive(stuck, 30.0)  # a dead thread is dead whatever the counter says
  assert engine_alive(FakeWorker(alive=True), 30.0)

BEAM_SEARCH = """
from orin_llm import kernel_cache
from tinygrad.codegen.opt import search
c = kernel_cache.COUNTER
c.install()
hooked, seen = search._time_program, []
def spy(*a, **k):  # progress as each candidate is timed: set by the hook before it times
  before = c.progress
  r = hooked(*a, **k)
  seen.append(c.progress > before)
  return r
search._time_program = spy
from tinygrad import Tensor
(Tensor.ones(16, 16).contiguous() + 1).realize()
print(len(seen), all(seen))
"""

def test_beam_search_reports_progress(tmp_path):
  """A real BEAM search (CPU) times its candidates through search._time_program, which the counter hooks."""
  env = {**os.environ, "PYTHONPATH": str(ROOT), "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "CACHEDB": str(tmp_path / "k.db")}
  r = subprocess.run([sys.executable, "-c", BEAM_SEARCH], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  n, ok = r.stdout.split()
  assert int(n) > 0 and ok == "True", r.stdout
