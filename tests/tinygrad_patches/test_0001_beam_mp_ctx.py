"""0001-beam-mp-ctx: BEAM_MP_CTX=fork|spawn picks the start method of tinygrad's worker pool (BEAM
search and parallel compilation); spawn stays the default and anything else is refused."""
import os, subprocess, sys, textwrap

# Read from stdin (`python -`), so there is no __main__ file a spawned worker could re-import. The
# probe is set in this process only: a forked worker inherits it, a spawned one re-imports tinygrad.
BEAM_MATMUL = textwrap.dedent("""
  import numpy as np
  import tinygrad.engine.worker as worker
  from tinygrad import Tensor
  worker.ORIN_PROBE = "parent-state"
  a, b = Tensor.rand(64, 64).realize(), Tensor.rand(64, 64).realize()
  c = (a @ b).realize()
  np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)
  pool = worker.worker_pool
  assert pool is not None, "BEAM did not use the worker pool"
  probe = "__import__('tinygrad.engine.worker', fromlist=['x']).__dict__.get('ORIN_PROBE')"
  print("start_method", pool._ctx.get_start_method(), "probe", pool.apply(eval, (probe,)))
""")

def run(src: str, **env) -> subprocess.CompletedProcess:
  # PARALLEL is tinygrad's worker count (helpers.PARALLEL); 0 or a daemon process would bypass the pool.
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "IGNORE_BEAM_CACHE": "1", **env}
  return subprocess.run([sys.executable, "-"], input=src, env=env, capture_output=True, text=True, timeout=600)

def test_fork_beam_search_from_stdin():
  r = run(BEAM_MATMUL, BEAM="2", BEAM_MP_CTX="fork")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "start_method fork probe parent-state" in r.stdout, r.stdout

def test_default_is_spawn():
  r = run("from tinygrad.engine.worker import get_worker_pool\nprint('start_method', get_worker_pool()._ctx.get_start_method())\n")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "start_method spawn" in r.stdout, r.stdout

def test_invalid_value_is_refused():
  r = run("from tinygrad.engine.worker import get_worker_pool\nget_worker_pool()\n", BEAM_MP_CTX="forkserver-typo")
  assert r.returncode != 0 and "BEAM_MP_CTX" in r.stderr and "forkserver-typo" in r.stderr, r.stderr[-3000:]
