"""scripts/occupancy.py: the blocks an SM holds from a kernel's threads, registers and shared memory (CUDA's occupancy
limits, worked by hand below), a rendered kernel's grid, and the one-line refusal without nvcc."""
import os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import occupancy

@pytest.mark.parametrize("threads,regs,smem,arch,want", [
  (128, 96, 4096, "sm_90", 5),    # 96 x 32 = 3072 registers a warp: 21 warps of 65536, 5 blocks of 4 warps
  (128, 70, 1024, "sm_90", 7),    # 70 -> 72 a thread in units of 256 a warp (2304): 28 warps, 7 blocks
  (128, 64, 1024, "sm_90", 8),    # 2048 a warp: 32 warps
  (256, 32, 4096, "sm_90", 8),    # by threads: 2048 / 256
  (32, 14, 0, "sm_90", 32),       # by the blocks an SM may hold
  (128, 24, 120000, "sm_90", 1),  # by shared memory: 232448 // (120000 + 1024)
  (128, 96, 4096, "sm_87", 5),    # the Orin's SM: the same register file
  (256, 32, 0, "sm_87", 6),       # 1536 threads an SM
  (1024, 255, 0, "sm_90", 0),     # 255 -> 256 a thread: 8 warps' registers, a block of 32 warps does not fit
])
def test_blocks_per_sm(threads, regs, smem, arch, want):
  assert occupancy.blocks_per_sm(threads, regs, smem, arch) == want

def test_grid_of_a_rendered_kernel():
  """The grid from the sizes tinygrad writes beside blockIdx: a Q4_K product rendered for sm_90 on the CPU launches as
  many blocks as its name's first (global) size, and a symbolic size is flagged."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("MV_", "BEAM"))} | {"DEV": "CPU", "ORIN_LLM_AFFINE": "1"}
  code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import occupancy; from render_kernels import render\n"
          "from gguf import GGMLQuantizationType as QT; from tinygrad import Tensor; from tinygrad.helpers import Target\n"
          "from tinygrad.renderer.cstyle import CUDARenderer; from tinygrad.uop.ops import Ops\n"
          "from orin_llm.quant import QuantWeight, empty_planes\n"
          "ren = CUDARenderer(Target('CUDA', '', 'sm_90'), use_nvcc=True)\n"
          "y = QuantWeight(QT.Q4_K, 2048, 4096, empty_planes(QT.Q4_K, 2048, 4096, 'CPU'))(Tensor.empty(1, 4096, device='CPU'))\n"
          "name, _, src = [render(c.src[0], ren) for c in y.linear_with_vars()[0].src if c.src[0].op is Ops.SINK][-1]\n"
          "print(json.dumps([name, occupancy.grid(src)]))")
  r = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts")], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  import json
  name, (blocks, sym) = json.loads(r.stdout.strip().splitlines()[-1])
  assert blocks == int(name.split("_")[1]) and blocks > 1 and not sym
  assert occupancy.grid("int gidx0 = blockIdx.x; /* (start_pos//1024+1) */\n  int gidx1 = blockIdx.y; /* 8 */") == (8, True)

def test_refusals(tmp_path):
  """One line each: no nvcc on PATH, fewer than one SM, a --min-blocks that is not NAME=N (N from 1 to 32)."""
  run = lambda *a: subprocess.run([sys.executable, ROOT / "scripts/occupancy.py", str(tmp_path / "m.gguf"), *a],
                                  capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
  r = run()
  assert r.returncode != 0 and "occupancy: nvcc is not on PATH" in r.stderr
  r = run("--sms", "0")
  assert r.returncode != 0 and "occupancy: --sms 0: a number of SMs of at least 1" in r.stderr
  r = run("--min-blocks", "r_896=33")
  assert r.returncode != 0 and "occupancy: --min-blocks 'r_896=33': NAME=N is needed" in r.stderr
