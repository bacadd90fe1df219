"""prewarm._Stop, the prewarm's SIGTERM handler: a Stopped raised where Python drops it (inside a finalizer: a signal
lands between any two bytecodes, tinygrad's UOp.__del__ included) is delivered again until the prewarm catches one,
and the dropped one prints nothing. Before, such a prewarm ran on with its worker pool gone and printed an "Exception
ignored in: <function UOp.__del__ ...>" traceback (CI: tests/test_cache.py's SIGTERM test, one run in four)."""
import os, pathlib, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import signal, sys, time
  from orin_llm.prewarm import _Stop, Stopped
  stop = _Stop()
  signal.signal(signal.SIGTERM, stop)
  sys.unraisablehook = stop.unraisable
  class Finalized:
    def __del__(self): stop(signal.SIGTERM, None)  # the handler run inside a finalizer, as a signal arriving there runs it
  t0 = time.monotonic()
  try:
    Finalized()  # dropped at once: its Stopped is raised inside __del__ and dropped
    print("dropped", flush=True)
    while time.monotonic() - t0 < 20: sum(range(1000))
    print("not stopped")
  except Stopped:
    stop.caught.set()
    print(f"stopped after {time.monotonic() - t0:.1f} s")
""")

def test_a_stop_dropped_in_a_finalizer_comes_again(tmp_path):
  (tmp_path / "stop.py").write_text(SCRIPT)
  r = subprocess.run([sys.executable, str(tmp_path / "stop.py")], env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])}, capture_output=True,
                     text=True, timeout=60)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.startswith("dropped") and "stopped after" in r.stdout, r.stdout + r.stderr[-3000:]
  assert float(r.stdout.split("stopped after ")[1].split()[0]) < 5, r.stdout
  assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
