"""0006-estimates-per-multiplier: a kernel's cost estimate (flops, bytes) is summed per loop multiplier.
Stock tinygrad adds one term per ALU op, so a kernel with thousands of ops inside a symbolic loop (a padded
prefill chunk at a symbolic position, unrolled by the optimizer) carries an ADD chain thousands deep in its
KernelInfo: hashing it is slow, printing it overflows the recursion limit, and in a worker pool the pickled
result fails and the parent waits forever."""
import os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import numpy as np
  from tinygrad import Tensor, UOp
  rng = np.random.default_rng()
  a_np = rng.normal(size=(64, 32)).astype(np.float32)
  n = int(rng.integers(3, 60))
  v = UOp.variable("n", 1, 64).bind(n)
  x = Tensor(a_np).realize()[:v]  # rows: a symbolic loop
  scales = rng.uniform(0.5, 1.5, 100)
  y = sum(((x * float(s)).sin() for s in scales), start=Tensor.zeros(1))  # ~2000 ALU ops in one kernel
  out = Tensor.zeros(64, 32).contiguous().realize()
  out[:v].assign(y).realize()
  got = out.numpy()[:n]
  want = sum(np.sin(a_np[:n].astype(np.float64) * s) for s in scales)
  assert np.allclose(got, want, rtol=1e-4, atol=1e-3), np.abs(got - want).max()
  print("ok")
""")

def test_symbolic_kernel_with_many_ops(tmp_path):
  # PARALLEL=0: compiled in this process, so a stock tinygrad raises RecursionError instead of hanging its pool
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "0", "CACHEDB": str(tmp_path / "cache.db")}
  r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-1500:]
