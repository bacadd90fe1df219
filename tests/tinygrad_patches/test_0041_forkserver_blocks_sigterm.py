"""0041-forkserver-blocks-sigterm: the worker pool's fork server blocks SIGTERM. `timeout`, `kill -- -PGID` and systemd signal the whole
process group, the fork server included. One killed so while the pool's worker handler thread replaced a worker that died of the same
signal refused the connection (multiprocessing restarts a server only once its pid is reaped), and that thread died with a
ConnectionRefusedError traceback before the prewarm ended its pool (CI's tests/test_cache.py group test, twenty-ninth session). The race is
a few milliseconds wide; what closes it is tested: the server outlives a SIGTERM and serves the replacements, and still ends with the
process it serves. Blocked, not ignored: a worker forked from it ended by a SIGTERM before its initializer ran (Pool's finalizer right after a
short-lived pool started) kept running when the server ignored it, and held its caller's stdout open (test_0007's held lock, 2 runs in 4)."""
import os, sys, textwrap
from conftest import run_in_own_session

SCRIPT = textwrap.dedent("""
  import os, signal, time
  from multiprocessing import forkserver
  from tinygrad.engine import worker
  got = []
  signal.signal(signal.SIGTERM, lambda s, f: got.append(s))  # a prewarm's handler: this process goes on to end its pool
  pool = worker.get_worker_pool()
  assert sorted(pool.map(abs, [-1, -2, -3, -4])) == [1, 2, 3, 4]
  # a worker runs with SIGTERM at its default and unblocked (the server blocks it): Pool.terminate ends the workers with it
  dfl = pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL and signal.SIGTERM not in pool.apply(signal.pthread_sigmask, (signal.SIG_BLOCK, []))
  server, first = forkserver._forkserver._forkserver_pid, [p.pid for p in pool._pool]
  if os.environ["TO"] == "server":
    os.kill(server, signal.SIGTERM); time.sleep(0.5)  # the server first: the race lost
    for pid in first: os.kill(pid, signal.SIGTERM)
  else: os.killpg(0, signal.SIGTERM)  # what `timeout` and systemd send
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and (len(pool._pool) < 2 or any(p.pid in first for p in pool._pool)): time.sleep(0.05)
  # (the pool takes no task now: a worker killed while idle may hold its task queue's lock, which terminate_worker_pool frees, patch 0018)
  print("server", server, "same", forkserver._forkserver._forkserver_pid == server, "replaced", not any(p.pid in first for p in pool._pool),
        "worker default", dfl, "got", got, flush=True)
  worker.terminate_worker_pool()
  print("pool", worker.worker_pool, flush=True)
""")

def _run(tmp_path, to):
  (tmp_path / "sigterm.py").write_text(SCRIPT)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": "forkserver", "TO": to}
  # the fork server keeps the script's stdout open: communicate() returning says that it ended with the script (it blocks SIGTERM, so nothing
  # else ends it); one left running is reported as "did not return"
  out, err = run_in_own_session([sys.executable, str(tmp_path / "sigterm.py")], env, 60)
  assert "pool None" in out and "Traceback" not in err, (out, err[-3000:])
  return out

def test_the_fork_server_outlives_a_sigterm(tmp_path):
  out = _run(tmp_path, "server")
  # stock: the server died, and the replacements came from a new one (its pid reaped) or none (a traceback)
  assert "same True replaced True worker default True got []" in out, out

def test_a_group_sigterm_ends_quietly_and_so_does_the_server(tmp_path):
  assert "same True replaced True worker default True got [15]" in _run(tmp_path, "group")

# the server is spawned with SIGTERM blocked, before it imports anything (its preload takes ~0.1-1 s): PRELOAD=none starts it without
# forkserver_preload. A child it forks (here a plain Process, no pool initializer) runs with SIGTERM unblocked: raise_signal ends it
STARTED = textwrap.dedent("""
  import os, signal
  from multiprocessing import forkserver
  from tinygrad.engine import worker
  ctx = worker._forkserver_context()
  if os.environ["PRELOAD"] == "none": ctx.set_forkserver_preload([])
  p = ctx.Process(target=signal.raise_signal, args=(signal.SIGTERM,))
  p.start(); p.join(30)
  with open(f"/proc/{forkserver._forkserver._forkserver_pid}/status") as f:
    blocked = int(next(l for l in f if l.startswith("SigBlk")).split()[1], 16) >> (signal.SIGTERM - 1) & 1
  print("server blocks", bool(blocked), "child exit", p.exitcode, flush=True)
""")

def test_the_server_blocks_sigterm_from_its_start_and_its_children_do_not(tmp_path):
  (tmp_path / "started.py").write_text(STARTED)
  for preload, child in (("none", 0), ("default", -15)):  # none: nothing unblocks it in the child, so it stays pending
    env = {**os.environ, "DEV": "CPU", "BEAM_MP_CTX": "forkserver", "PRELOAD": preload}
    out, err = run_in_own_session([sys.executable, str(tmp_path / "started.py")], env, 60)
    assert f"server blocks True child exit {child}" in out, (preload, out, err[-3000:])

SHORT = textwrap.dedent("""
  from tinygrad.engine import worker
  print("abs", worker.get_worker_pool().apply(abs, (-3,)), flush=True)  # then exit: Pool's finalizer ends workers that may still be starting
""")

def test_a_short_lived_pool_leaves_no_worker(tmp_path):
  (tmp_path / "short.py").write_text(SHORT)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": "forkserver"}
  for _ in range(6):  # a worker left running holds stdout open: run_in_own_session's communicate() waits until its timeout
    out, err = run_in_own_session([sys.executable, str(tmp_path / "short.py")], env, 30)
    assert "abs 3" in out and "Traceback" not in err, (out, err[-3000:])
