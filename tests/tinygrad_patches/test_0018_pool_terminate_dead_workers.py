"""0018-pool-terminate-dead-workers: terminate_worker_pool() returns when the pool's workers were killed while holding one of its
queues' locks. An idle worker waits for a task holding the task queue's read lock; Pool.terminate() takes that lock with no timeout.
`timeout` and systemd send SIGTERM to the whole process group, so the workers (SIGTERM at its default since 0016) died at once, one of
them holding the lock, and the prewarm's terminate() in its SIGTERM handling waited for good: on the GPU machine `timeout 330 orin-llm
prewarm` ran on until the call's limit (twelfth session), on CPU half the prewarms signalled so hung (tests/test_cache.py's group test)."""
import os, sys, textwrap
import pytest
from conftest import run_in_own_session

SCRIPT = textwrap.dedent("""
  import os, random, signal, time
  from tinygrad.engine import worker
  pool = worker.get_worker_pool()
  assert sorted(pool.map(abs, [-1, -2, -3, -4])) == [1, 2, 3, 4]  # the workers are up, then idle: one waits for a task holding the lock
  time.sleep(random.uniform(0.2, 0.6))
  for p in list(pool._pool): os.kill(p.pid, signal.SIGTERM)  # what a SIGTERM to the process group does to them
  time.sleep(0.5)
  t = time.perf_counter()
  worker.terminate_worker_pool()
  print("terminated in", round(time.perf_counter() - t, 1), "s, pool", worker.worker_pool)
""")

@pytest.mark.parametrize("ctx", ["forkserver", "spawn", "fork"])
def test_terminate_after_the_workers_were_killed(tmp_path, ctx):
  (tmp_path / "kill_workers.py").write_text(SCRIPT)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": ctx}
  # the replacement workers and the fork server, which wait on the lock for good when it hangs, are killed after
  out, err = run_in_own_session([sys.executable, str(tmp_path / "kill_workers.py")], env, 30)
  assert "terminated in" in out and "pool None" in out, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
