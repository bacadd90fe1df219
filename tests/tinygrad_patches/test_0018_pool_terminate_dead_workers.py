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

HELD = textwrap.dedent("""
  import threading, time
  from tinygrad.engine import worker
  pool = worker.get_worker_pool()
  assert sorted(pool.map(abs, [-1, -2, -3])) == [1, 2, 3]
  errors, taken = [], threading.Event()
  def handler_like():  # what the pool's task handler thread does at its end: put a sentinel under the result queue's write lock
    try:
      with pool._outqueue._wlock:
        taken.set(); time.sleep(0.3)
    except Exception as e: errors.append(repr(e))
  t = threading.Thread(target=handler_like); t.start(); taken.wait()
  worker.terminate_worker_pool()
  t.join()
  print("errors", errors)
""")

def test_a_lock_held_by_a_live_thread_is_waited_for(tmp_path):
  # the CI's SIGTERM test once printed "ValueError: semaphore or lock released too many times" from the task handler thread: terminate
  # released the result queue's write lock while that live thread held it (fourteenth session)
  (tmp_path / "held.py").write_text(HELD)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": "forkserver"}
  out, err = run_in_own_session([sys.executable, str(tmp_path / "held.py")], env, 30)
  assert "errors []" in out, (out, err[-3000:])

INTERRUPTED = textwrap.dedent("""
  import os, signal
  from tinygrad.engine import worker
  class Stop(Exception): pass
  def handler(signum, frame): raise Stop()
  signal.signal(signal.SIGTERM, handler)
  pool = worker.get_worker_pool()
  assert sorted(pool.map(abs, [-1, -2, -3])) == [1, 2, 3]  # up, then idle: a worker waits for a task holding the task queue's lock
  # the SIGTERM comes while the terminate runs, from a step it takes before it ends the workers (a timer that fired 0.3 s after the start
  # once came after a terminate that had already returned: CI, fifteenth session's submission)
  join = pool._worker_handler.join
  def join_after_a_signal(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    return join(*args)
  pool._worker_handler.join = join_after_a_signal
  try:
    worker.terminate_worker_pool()
    print("not interrupted")
  except Stop: print("raised, pool", pool._state)
""")

@pytest.mark.parametrize("ctx", ["forkserver", "fork"])
def test_a_signal_during_terminate_is_raised_after_it(tmp_path, ctx):
  # a prewarm's SIGTERM is delivered again every second until it is caught (prewarm._Stop); one that came while the search's
  # terminate_worker_pool waited on a dead worker's lock raised inside it, left that pool unterminated with the global cleared, and at
  # exit the pool's finalizer waited on the lock for good: CI's two SIGTERM prewarm tests ran into their 120 s limit after the prewarm
  # had printed that it stopped (fourteenth session's submission). Without the hold this prints "raised, pool RUN" (2 of 2 each).
  (tmp_path / "interrupted.py").write_text(INTERRUPTED)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": ctx}
  out, err = run_in_own_session([sys.executable, str(tmp_path / "interrupted.py")], env, 30)
  assert "raised, pool TERMINATE" in out, (out, err[-3000:])
  assert "Traceback" not in err, err[-3000:]

BUSY = textwrap.dedent("""
  import os, signal, time
  from tinygrad.engine import worker
  for run in range(3):
    pool = worker.get_worker_pool()
    assert sorted(pool.map(abs, [-1, -2])) == [1, 2]
    # tasks far larger than a pipe's buffer (64 KiB), so the workers spend their time reading them and the task handler writing them
    it = pool.imap_unordered(len, [os.urandom(4 << 20) for _ in range(60)])
    time.sleep(0.2)
    for p in list(pool._pool):  # what a SIGTERM to the process group does to them
      try: os.kill(p.pid, signal.SIGTERM)
      except ProcessLookupError: pass  # a worker that had just ended by itself, not reaped yet
    time.sleep(0.3)
    t = time.perf_counter()
    worker.terminate_worker_pool()
    print("terminated in", round(time.perf_counter() - t, 1), "s, task handler alive:", pool._task_handler.is_alive(), flush=True)
""")

@pytest.mark.parametrize("ctx", ["forkserver", "fork"])
def test_terminate_while_tasks_were_being_sent(tmp_path, ctx):
  # workers killed while they read a task, the task handler blocked writing the next ones into the pipe that nobody reads now: Pool's own
  # drain (_help_stuff_finish) read the rest of a half-read task as a message and waited for its missing bytes, or stopped between two
  # writes of a task and left the handler blocked for good (the group SIGTERM prewarm test, fifteenth session: 1 of 1). Without the
  # byte-wise drain this script never printed (2 of 2).
  (tmp_path / "busy.py").write_text(BUSY)
  # workers that do not end by themselves after BEAM_MAX_TASKS_PER_CHILD (16) tasks: 60 tasks of 4 MiB took under 0.2 s on an idle
  # 2-core machine, and a worker that had ended was killed (ProcessLookupError, twenty-third session's CI: 1 of 7 runs)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "2", "BEAM_MP_CTX": ctx, "BEAM_MAX_TASKS_PER_CHILD": "1000"}
  out, err = run_in_own_session([sys.executable, str(tmp_path / "busy.py")], env, 90)
  assert out.count("task handler alive: False") == 3, (out, err[-3000:])
