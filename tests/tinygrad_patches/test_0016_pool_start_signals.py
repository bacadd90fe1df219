"""0016-pool-start-signals: SIGINT and SIGTERM are held while the worker pool starts its workers, then delivered. Before,
Ctrl-C (or a SIGTERM handler that raises, as `orin-llm prewarm` installs) arriving while Pool() started them left the
workers already started running with nobody to end them: Pool.__init__ cleans up on Exception only, and worker_pool was
not set yet. A forkserver worker orphaned so printed a FileNotFoundError traceback after the process exited (CI saw it
in tests/test_cache.py::test_prewarm_stopped_by_sigterm_ends_quietly)."""
import os, subprocess, sys, textwrap
import pytest
from conftest import run_in_own_session

# The signal is sent from inside the start of a randomly chosen worker (not the first), as if it arrived right then.
SCRIPT = textwrap.dedent("""
  import multiprocessing, os, random, signal, sys
  from tinygrad.engine import worker
  class Stopped(KeyboardInterrupt): pass
  def stop(signum, frame): raise Stopped()
  signal.signal(signal.SIGTERM, stop)
  # Python's own SIGINT handler, which a process started with SIGINT ignored lacks (a background job of a non-interactive
  # shell, as `bash .ci/run &` is: there the SIGINT case printed "not interrupted")
  signal.signal(signal.SIGINT, signal.default_int_handler)
  sig = getattr(signal, sys.argv[1])
  at = random.randint(2, int(os.environ["PARALLEL"]))
  Process = worker._ForkServerWorkerProcess if os.environ["BEAM_MP_CTX"] == "forkserver" else worker._WorkerProcess
  orig, started = Process._Popen, []
  def popen(process_obj):
    ret = orig(process_obj)
    started.append(ret.pid)
    if len(started) == at: os.kill(os.getpid(), sig)
    return ret
  Process._Popen = staticmethod(popen)
  try:
    worker.get_worker_pool()
    print("not interrupted")
  except KeyboardInterrupt as e:
    print("interrupted", type(e).__name__, "with the pool set" if worker.worker_pool is not None else "before the pool was set")
    worker.terminate_worker_pool()
  print("started", len(started), "left running", len(multiprocessing.active_children()))
""")

@pytest.mark.parametrize("ctx,sig", [("forkserver", "SIGTERM"), ("forkserver", "SIGINT"), ("spawn", "SIGTERM")])
def test_signal_while_the_pool_starts_leaves_no_worker_behind(tmp_path, ctx, sig):
  (tmp_path / "start_pool.py").write_text(SCRIPT)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "4", "BEAM_MP_CTX": ctx}
  r = subprocess.run([sys.executable, str(tmp_path / "start_pool.py"), sig], env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  want = "Stopped" if sig == "SIGTERM" else "KeyboardInterrupt"
  assert f"interrupted {want} with the pool set" in r.stdout and "started 4 left running 0" in r.stdout, r.stdout + r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr[-3000:]

# A forked worker inherits the handlers of the moment it was forked: those that hold the signals while the pool starts. It must still end
# on the SIGTERM that Pool.terminate sends it (each worker is joined after): before, every forked pool's terminate() waited for good
# (test_0010's stalled pool was never replaced).
TERMINATE = textwrap.dedent("""
  import signal, time
  from tinygrad.engine import worker
  signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a handler of the parent's own, as a service has
  pool = worker.get_worker_pool()
  busy = pool.apply_async(time.sleep, (600,))  # one worker busy, the other waiting for a task
  time.sleep(1)
  t = time.perf_counter()
  worker.terminate_worker_pool()
  print("terminated in", round(time.perf_counter() - t, 1), "s")
""")

def test_forked_workers_end_on_terminate(tmp_path):
  (tmp_path / "terminate.py").write_text(TERMINATE)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": "fork"}
  out, err = run_in_own_session([sys.executable, str(tmp_path / "terminate.py")], env, 60)  # the workers killed when they did not end
  assert "terminated in" in out, err[-3000:]
