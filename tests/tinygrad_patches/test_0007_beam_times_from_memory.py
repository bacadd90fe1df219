"""0007-beam-times-from-memory: BEAM times each candidate kernel after evicting the device's caches, on every
device. Stock tinygrad flushes only where the device can invalidate its caches (AMD, NV), so on CUDA (and the
CPU) a kernel whose data fit in the L2 was timed from it: a 13-26 MiB matvec on an H200 (50 MiB of L2), whose
data in the model streams from memory. The flush is a copy of BEAM_FLUSH_MB between two buffers allocated once."""
import os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import numpy as np
  from tinygrad import Tensor
  from tinygrad.device import Buffer
  copies = []
  orig = Buffer.copy_from
  def copy_from(self, src):
    copies.append((self.device, self.nbytes))
    return orig(self, src)
  Buffer.copy_from = copy_from
  rng = np.random.default_rng()
  a = rng.normal(size=(96, 160)).astype(np.float32)
  x = rng.normal(size=(160,)).astype(np.float32)
  got = (Tensor(a) * Tensor(x)).sum(-1).numpy()  # a reduction: BEAM searches its kernel
  assert np.allclose(got, a.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)
  flushes = [n for d, n in copies if n >= 3 << 20]
  print(len(flushes), min(flushes, default=0))
""")

def test_beam_flushes_before_each_timing(tmp_path):
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "IGNORE_BEAM_CACHE": "1", "BEAM_FLUSH_MB": "3",
         "CACHEDB": str(tmp_path / "cache.db")}
  r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-1500:]
  n, size = map(int, r.stdout.split())
  # a flush of the configured size before every timing of every candidate (stock: none on a device like this)
  assert n >= 10 and size == 3 << 20, r.stdout
