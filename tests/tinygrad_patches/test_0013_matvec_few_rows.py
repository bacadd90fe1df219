"""0013-matvec-few-rows: a product of a weight with a few input rows at once (a batch of decode tokens, a
speculative verify step) is optimized as a matvec, each thread keeping an accumulator per input row, so that
the weight is read once for all rows. Stock (and 0003 alone) left such a kernel to the generic opts: one thread
per output walking the whole reduce (verify steps of 8 rows cost 5-9 decode steps, H100, docs/PERF.md).
No GPU needed for the opts (renderers constructed without a device); the numerics run on tinygrad's
CUDA-flavoured emulator."""
import os, subprocess, sys, textwrap
import pytest
from tinygrad.codegen.opt import Opt, OptOps
from test_0003_matvec_heuristic import N, K, applied_opts, cuda, empty, q4_weight

pytestmark = pytest.mark.usefixtures("without_rows_first")  # 0022 lays the rows out first otherwise

def few_rows() -> tuple[Opt, ...]:
  # the warp over the reduce, 4 weight rows a thread, the innermost reduce range (the input's contiguous elements)
  # read 4 at a time, every input row in each thread
  return (Opt(OptOps.GROUP, 0, 32), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 1, 4),
          Opt(OptOps.UPCAST, 0, 0))

@pytest.mark.parametrize("rows", [2, 4, 8])
@pytest.mark.parametrize("weight", ["fp32", "q4"])
def test_a_few_rows_are_a_matvec(rows, weight):
  w = empty(N, K) if weight == "fp32" else q4_weight()
  y = (empty(rows, 1, K) * w.reshape(1, N, K)).sum(-1)
  # UNROLL 1: the last unrollable range after the GROUP: fp32 (the group, 1536/32), q4 (the group, 8 nibbles)
  assert applied_opts(y, cuda()) == few_rows()

def test_many_rows_are_a_matmul():
  y = (empty(16, 1, K) * q4_weight().reshape(1, N, K)).sum(-1)
  assert not any(o.op is OptOps.GROUP for o in applied_opts(y, cuda()))

def test_a_short_reduce_is_no_weight_row():
  # 4 query heads against 64 keys of head_dim 128 (attention scores): the reduce is a head's dot product
  y = (empty(4, 1, 128) * empty(1, 64, 128)).sum(-1)
  assert not any(o.op is OptOps.GROUP for o in applied_opts(y, cuda()))

def test_few_rows_compute_the_product():
  code = textwrap.dedent('''
    import numpy as np
    from tinygrad import Tensor, dtypes
    rng = np.random.default_rng()
    R, K, T = 64, 256, 4
    q = rng.integers(0, 2**32, size=(R, K // 8), dtype=np.uint32); s = rng.normal(size=(R, K // 32)).astype(np.float32)
    x = rng.normal(size=(T, 1, K)).astype(np.float32)
    u = ((Tensor(q).unsqueeze(-1) >> (Tensor.arange(8, dtype=dtypes.uint32) * 4)) & 15).reshape(R, K).cast(dtypes.float32)
    w = u * Tensor(s).unsqueeze(-1).expand(R, K // 32, 32).reshape(R, K)
    y = (Tensor(x) * w.reshape(1, R, K)).sum(-1).numpy()
    un = ((q[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15).reshape(R, K).astype(np.float64)
    ref = x[:, 0].astype(np.float64) @ (un * np.repeat(s, 32, axis=1)).T
    print(np.abs(y - ref).max() / np.abs(ref).max())
  ''')
  env = {**os.environ, "DEV": "PYTHON::sm_87", "DEBUG": "3"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "MATVEC:" in out.stdout + out.stderr  # optimized as a matvec
  assert float(out.stdout.strip().splitlines()[-1]) < 1e-5
