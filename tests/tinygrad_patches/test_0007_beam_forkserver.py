"""0007-beam-forkserver: BEAM_MP_CTX=forkserver makes tinygrad's worker pool (BEAM search, parallel compilation)
fork its workers from a fork server: a fresh interpreter that imported tinygrad once, so workers start without a
re-import and never inherit a lock held by another thread of the parent."""
import os, subprocess, sys, textwrap

def run(src: str, cwd=None, script: str | None = None, **env) -> subprocess.CompletedProcess:
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "IGNORE_BEAM_CACHE": "1", "BEAM_MP_CTX": "forkserver", **env}
  if script is not None: return subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300, cwd=cwd)
  return subprocess.run([sys.executable, "-"], input=src, env=env, capture_output=True, text=True, timeout=300, cwd=cwd)

# from stdin, as test_0001: BEAM through a forkserver pool; the server preloaded the search module; a value set in this
# process after import is not seen by a worker (no fork of this process)
BEAM_MATMUL = textwrap.dedent("""
  import numpy as np
  import tinygrad.engine.worker as worker
  from tinygrad import Tensor
  worker.ORIN_PROBE = "parent-state"
  pool = worker.get_worker_pool()
  preloaded = pool.apply(eval, ("'tinygrad.codegen.opt.search' in __import__('sys').modules",))
  a, b = Tensor.rand(16, 16).realize(), Tensor.rand(16, 16).realize()
  c = (a @ b).realize()
  np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)
  assert worker.worker_pool is pool, "BEAM did not use the worker pool"
  probe = "__import__('tinygrad.engine.worker', fromlist=['x']).__dict__.get('ORIN_PROBE')"
  print("start_method", pool._ctx.get_start_method(), "preloaded", preloaded, "probe", pool.apply(eval, (probe,)))
""")

def test_forkserver_beam_search():
  r = run(BEAM_MATMUL, BEAM="1")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "start_method forkserver preloaded True probe None" in r.stdout, r.stdout

# a thread of the parent holds a lock while the pool starts: a forked worker inherits it held (the hang of
# issue 25), a forkserver worker does not
LOCKPROBE = textwrap.dedent("""
  import threading
  LOCK = threading.Lock()
  def take(_=None): return LOCK.acquire(timeout=3)
""")
HELD_LOCK = textwrap.dedent("""
  import threading, time, lockprobe
  from tinygrad.engine import worker
  held = threading.Event()
  def hold():
    with lockprobe.LOCK:
      held.set(); time.sleep(30)
  threading.Thread(target=hold, daemon=True).start()
  held.wait()
  pool = worker.get_worker_pool()
  print("acquired", pool._ctx.get_start_method(), pool.apply_async(lockprobe.take).get(timeout=60))
""")

def test_worker_does_not_inherit_a_held_lock(tmp_path):
  (tmp_path / "lockprobe.py").write_text(LOCKPROBE)
  env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
  r = run(HELD_LOCK, cwd=tmp_path, **env)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "acquired forkserver True" in r.stdout, r.stdout
  r = run(HELD_LOCK, cwd=tmp_path, **{**env, "BEAM_MP_CTX": "fork"})  # the hazard itself, for contrast
  assert r.returncode == 0 and "acquired fork False" in r.stdout, r.stdout + r.stderr[-3000:]

# a script without a __main__ guard: its top level must run once, not again in the server or in each worker
SCRIPT = textwrap.dedent("""
  print("top level ran")
  from tinygrad.engine import worker
  pool = worker.get_worker_pool()
  print("sum", sum(pool.map(abs, [-1, -2, -3, -4])))
""")

def test_script_main_is_not_reimported(tmp_path):
  (tmp_path / "script.py").write_text(SCRIPT)
  r = run("", script=str(tmp_path / "script.py"), cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.count("top level ran") == 1 and "sum 10" in r.stdout, r.stdout

# kernel_cache.use() sets CACHEDB and terminates the pool: the next pool's workers must see the new file
ENV_CHANGE = textwrap.dedent("""
  import os
  from tinygrad.engine import worker
  cachedb = "__import__('tinygrad.helpers', fromlist=['x']).CACHEDB"
  first = worker.get_worker_pool().apply(eval, (cachedb,))
  os.environ["CACHEDB"] = "/nonexistent/other.db"
  worker.terminate_worker_pool()
  print("cachedb", first != "/nonexistent/other.db", worker.get_worker_pool().apply(eval, (cachedb,)))
""")

def test_new_pool_sees_changed_environment():
  r = run(ENV_CHANGE)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "cachedb True /nonexistent/other.db" in r.stdout, r.stdout

def test_invalid_value_names_forkserver():
  r = run("from tinygrad.engine.worker import get_worker_pool\nget_worker_pool()\n", BEAM_MP_CTX="forkserve")
  assert r.returncode != 0 and "'forkserver'" in r.stderr and "forkserve'" in r.stderr, r.stderr[-3000:]
