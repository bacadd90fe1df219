"""0003-matvec-heuristic: hand_coded_optimizations recognizes decode matvecs whose multiply is wrapped in a
CAST or whose weight is a chain of ops (dequantized Q4, scaled by a norm factor), and reduces each row with a
full warp (32 threads) on NVIDIA renderers. No GPU needed: the kernels are scheduled for CPU and optimized
for renderers constructed without a device (CUDARenderer with nvcc as its compiler, PTXRenderer)."""
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.codegen import full_rewrite_to_sink
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import CUDARenderer, OpenCLRenderer
from tinygrad.renderer.ptx import PTXRenderer
from tinygrad.uop.ops import Ops

# these tests pin 0003's (and 0013's, 0017's) opts: 0020's unroll of the innermost range is off here
pytestmark = pytest.mark.usefixtures("without_inner_unroll")

N, K = 576, 1536  # SmolLM2-135M's down projection

def cuda(): return CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)  # nvcc: no libnvrtc needed to construct
def ptx(): return PTXRenderer(Target("CUDA", "PTX", "sm_87"))
def opencl(): return OpenCLRenderer(Target("CL"))

def empty(*shape, dtype=dtypes.float32): return Tensor.empty(*shape, dtype=dtype, device="CPU")

def q4_weight(n=N, k=K) -> Tensor:
  planes, scale, off = empty(n, k//8, dtype=dtypes.uint32), empty(n, k//32), empty(n, k//32)
  shifts = Tensor([0, 4, 8, 12, 16, 20, 24, 28], dtype=dtypes.uint32, device="CPU").reshape(1, 1, 8)
  per_block = lambda t: t.reshape(n, k//32, 1).expand(n, k//32, 32).reshape(n, k)
  return ((planes.reshape(n, k//8, 1) >> shifts) & 15).reshape(n, k).cast(dtypes.float32) * per_block(scale) - per_block(off)

def matvecs() -> dict[str, Tensor]:
  x, xh = empty(K), empty(K, dtype=dtypes.half)
  return {
    "fp32": (x.reshape(1, K) * empty(N, K)).sum(-1),
    "fp16 weight cast to fp32": (x.reshape(1, K) * empty(N, K, dtype=dtypes.half).float()).sum(-1),
    "fp16 accumulated in fp32": (xh.reshape(1, K) * empty(N, K, dtype=dtypes.half)).sum(-1, dtype=dtypes.float32),
    "q4 dequantized weight": (x.reshape(1, K) * q4_weight()).sum(-1),
    "norm factor": ((x * empty(K)).reshape(1, K) * empty(N, K)).sum(-1),
  }

def applied_opts(t: Tensor, ren) -> tuple[Opt, ...]:
  asts = [c.src[0] for c in t.schedule_linear().src]
  [ast] = [a for a in asts if a.op is Ops.SINK and any(u.op is Ops.REDUCE for u in a.toposort())]
  return full_rewrite_to_sink(ast, ren).arg.applied_opts

def matvec_opts(threads: int) -> tuple[Opt, ...]:
  return (Opt(OptOps.GROUP, 0, threads), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 4))

@pytest.mark.parametrize("ren", [cuda, ptx], ids=["CUDARenderer", "PTXRenderer"])
@pytest.mark.parametrize("name", list(matvecs()))
def test_nvidia_warp_per_row(name, ren):
  assert applied_opts(matvecs()[name], ren()) == matvec_opts(32)

@pytest.mark.parametrize("name", list(matvecs()))
def test_other_devices_keep_8_threads(name):
  assert applied_opts(matvecs()[name], opencl()) == matvec_opts(8)

def test_fewer_threads_when_the_reduce_does_not_divide():
  # Q4 with K=576 splits the reduce into 72 packed words x 8 nibbles; 72 is no multiple of 32 (or 16)
  y = (empty(576).reshape(1, 576) * q4_weight(N, 576)).sum(-1)
  assert applied_opts(y, cuda()) == matvec_opts(8)

def test_threads_from_the_next_reduce_range_when_the_first_is_taken_whole():
  # Q4 with K=64: the reduce splits into 8 packed words x 8 nibbles; 8 threads take the words whole, the other
  # 4 of the warp's 32 come from the nibbles (the version that grouped only the first range gave GROUP 8 alone)
  y = (empty(64).reshape(1, 64) * q4_weight(N, 64)).sum(-1)
  assert applied_opts(y, cuda()) == (Opt(OptOps.GROUP, 0, 8), Opt(OptOps.GROUP, 0, 4), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 4))

def test_grouping_two_ranges_computes_the_matvec():
  # the same kernel run on tinygrad's CUDA-flavoured emulator (locals and shared memory, no GPU) against numpy
  import subprocess, sys, textwrap
  code = textwrap.dedent('''
    import numpy as np
    from tinygrad import Tensor, dtypes
    rng = np.random.default_rng()
    R, K = 64, 64
    q = rng.integers(0, 2**32, size=(R, K // 8), dtype=np.uint32); s = rng.normal(size=(R, K // 32)).astype(np.float32)
    x = rng.normal(size=(1, K)).astype(np.float32)
    u = ((Tensor(q).unsqueeze(-1) >> (Tensor.arange(8, dtype=dtypes.uint32) * 4)) & 15).reshape(R, K).cast(dtypes.float32)
    y = (Tensor(x).unsqueeze(-2) * (u * Tensor(s).unsqueeze(-1).expand(R, K // 32, 32).reshape(R, K))).sum(-1).numpy()
    un = ((q[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15).reshape(R, K).astype(np.float64)
    ref = x.astype(np.float64) @ (un * np.repeat(s, 32, axis=1)).T
    print(np.abs(y - ref).max() / np.abs(ref).max())
  ''')
  import os
  env = {**os.environ, "DEV": "PYTHON::sm_87", "DEBUG": "3"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "tprs=[8, 4]" in out.stdout + out.stderr  # the kernel was optimized with the two GROUPs
  assert float(out.stdout.strip().splitlines()[-1]) < 1e-5

def test_matmul_is_not_a_matvec():
  # 16 rows: more than the few rows that patch 0013 takes as a matvec
  assert not any(o.op is OptOps.GROUP for o in applied_opts(empty(16, K) @ empty(N, K).T, cuda()))
