"""0010-beam-worker-timeout: BEAM waits for its workers' results with a timeout (BEAM_WORKER_TIMEOUT, default twice
BEAM_TIMEOUT_SEC): a worker that stalls (deadlocked after fork, killed) no longer hangs the search; the pool is replaced,
the candidates not compiled yet are retried once and then dropped, and the search goes on."""
import os, signal, subprocess, sys, textwrap

# A forked worker runs this module's replacement of _try_compile (fork pickles it by reference to __main__).
# stall_once: the first call anywhere sleeps for good (a marker file makes it once across processes); the retry passes.
# stall_always: every attempt at candidate 0 sleeps, so it is dropped after its retry, in every round.
SEARCH = textwrap.dedent("""
  import os, sys, time
  import numpy as np
  from tinygrad import Tensor
  from tinygrad.codegen.opt import search
  from tinygrad.engine import worker
  MARK, MODE = sys.argv[1], sys.argv[2]
  orig = search._try_compile
  def stall_once(x):
    try: os.close(os.open(MARK, os.O_CREAT | os.O_EXCL))
    except FileExistsError: return orig(x)
    time.sleep(3600)
  def stall_always(x):
    if x[0] == 0: time.sleep(3600)
    return orig(x)
  search._try_compile = stall_once if MODE == "once" else stall_always
  a, b = Tensor.rand(16, 16).realize(), Tensor.rand(16, 16).realize()
  st = time.perf_counter()
  c = (a @ b).realize()
  np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)
  print("stalled", os.path.exists(MARK) if MODE == "once" else True, "replaced", worker.stalled_pools, "seconds", round(time.perf_counter() - st))
""")

def run(tmp_path, mode: str) -> subprocess.CompletedProcess:
  (tmp_path / "stall_search.py").write_text(SEARCH)
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "2", "BEAM_MP_CTX": "fork", "IGNORE_BEAM_CACHE": "1", "BEAM_WORKER_TIMEOUT": "4"}
  # stock tinygrad waits for the stalled worker forever: the timeout is the failure, and the whole process group (the
  # sleeping workers too) is killed
  p = subprocess.Popen([sys.executable, str(tmp_path / "stall_search.py"), str(tmp_path / "stalled"), mode], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try: out, err = p.communicate(timeout=240)
  except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    raise
  finally:
    try: os.killpg(p.pid, signal.SIGKILL)  # a worker left behind
    except ProcessLookupError: pass
  return subprocess.CompletedProcess(p.args, p.returncode, out, err)

def test_stalled_worker_is_replaced_and_retried(tmp_path):
  r = run(tmp_path, "once")
  assert r.returncode == 0, r.stderr[-3000:]
  # (a slow compile on a loaded machine can exceed the timeout too: at least one replacement)
  assert "stalled True replaced" in r.stdout and int(r.stdout.split("replaced ")[1].split()[0]) >= 1, r.stdout

def test_candidate_that_always_stalls_is_dropped(tmp_path):
  r = run(tmp_path, "always")
  assert r.returncode == 0, r.stderr[-3000:]
  # two stalls (first try and retry) in each round of the search
  assert "stalled True replaced" in r.stdout and int(r.stdout.split("replaced ")[1].split()[0]) >= 2, r.stdout
