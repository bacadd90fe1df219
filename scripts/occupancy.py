#!/usr/bin/env python3
"""Each kernel of one engine step as an NVIDIA GPU would hold it, without the GPU: the step's kernels rendered as
render_kernels.py renders them, each compiled by nvcc for the arch (ptxas's report of registers, spills and shared
memory), and from those the blocks an SM holds at once, its warps, and the waves the kernel's grid takes on a GPU of
--sms SMs. Decode's one-row products are bound by the loads they keep in flight more than by their instructions (the
mantissas took 8% of the Q4_K loops' instructions out and the 8B's decode did not move, forty-second session): their
warps an SM and their waves are what to read first (docs/PERF.md, fiftieth session: the 8B's gate+up on an H100,
96 registers, 5 blocks of 128 threads an SM, 896 blocks in 1.36 waves).
  DEV=CPU python3 scripts/occupancy.py MODEL [--step decode|verify|chunk|batch] [--rows N] [--pos P] [--arch sm_90]
                                        [--sms 132] [--min-blocks NAME=N ...]
--sms: the GPU's SMs (132: H100 SXM and H200; 16: the Jetson AGX Orin 64GB). --min-blocks NAME=N: the kernel compiled
with __launch_bounds__(threads, N), as scripts/step_opts.py's --min-blocks runs it, to see what the bound costs in
registers and spills. A one-layer file keeps it quick (render_kernels.py says how to write one). Needs nvcc on PATH
(a CUDA toolkit, or NVIDIA's PyPI wheels)."""
import argparse, math, os, re, shutil, subprocess, sys, tempfile

# what one SM holds (CUDA's occupancy limits): registers, shared memory a block may use, blocks, threads
LIMITS = {"sm_87": (65536, 167936, 16, 1536), "sm_90": (65536, 232448, 32, 2048)}
REG_UNIT, SMEM_RESERVED = 256, 1024  # registers are given a warp in units of 256; the runtime keeps 1 KiB of a block's shared memory

def blocks_per_sm(threads: int, regs: int, smem: int, arch: str) -> int:
  """Blocks of `threads` threads using `regs` registers a thread and `smem` bytes of shared memory that one SM of
  the arch holds at once."""
  regs_sm, smem_sm, most_blocks, most_threads = LIMITS[arch]
  warps = -(-threads // 32)
  by_regs = (regs_sm // (-(-regs * 32 // REG_UNIT) * REG_UNIT)) // warps if regs else most_blocks
  by_smem = smem_sm // (smem + SMEM_RESERVED) if smem else most_blocks
  return min(by_regs, by_smem, most_blocks, most_threads // (warps * 32))

def grid(src: str) -> tuple[int, bool]:
  """The blocks a rendered kernel launches (tinygrad writes each grid axis's size beside its blockIdx), and whether an
  axis is symbolic (its size follows a variable: counted as 1 here)."""
  sizes = re.findall(r"blockIdx\.[xyz]; /\* ([^*]+) \*/", src)
  return math.prod(int(s) for s in sizes if s.strip().isdigit()), any(not s.strip().isdigit() for s in sizes)

def compile_report(src: str, arch: str) -> tuple[int, int, int]:
  """(registers a thread, bytes of spill stores, bytes of shared memory) as ptxas reports them for the source."""
  with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "k.cu")
    with open(p, "w") as f: f.write(src)
    r = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", p, "-o", os.path.join(d, "k.cubin")],
                       capture_output=True, text=True)
  if r.returncode: raise RuntimeError(f"nvcc failed: {r.stderr[-500:]}")
  num = lambda pat: int(m.group(1)) if (m := re.search(pat, r.stderr)) else 0
  return num(r"Used (\d+) registers"), num(r"(\d+) bytes spill stores"), num(r"(\d+) bytes smem")

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("model"); ap.add_argument("--step", choices=("decode", "verify", "chunk", "batch"), default="decode")
  ap.add_argument("--rows", type=int, default=None); ap.add_argument("--pos", type=int, default=64)
  ap.add_argument("--context", type=int, default=4352); ap.add_argument("--arch", choices=sorted(LIMITS), default="sm_90")
  ap.add_argument("--sms", type=int, default=132); ap.add_argument("--min-blocks", action="append", default=[])
  a = ap.parse_args()
  if a.sms < 1: sys.exit(f"occupancy: --sms {a.sms}: a number of SMs of at least 1 is needed")
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import step_opts
  try: bounds = dict(step_opts.parse_bounds(s) for s in a.min_blocks)
  except ValueError as e: sys.exit(f"occupancy: --min-blocks {e}")
  if shutil.which("nvcc") is None: sys.exit("occupancy: nvcc is not on PATH (a CUDA toolkit, or NVIDIA's PyPI wheels)")
  step_opts.install_bounds(bounds)
  from render_kernels import render, step_engine, step_kernels
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  eng, rows = step_engine(a.model, a.step, a.rows, a.context)
  ren, seen = CUDARenderer(Target("CUDA", "", a.arch), use_nvcc=True), set()
  print(f"{'kernel':48s} {'threads':>7s} {'blocks':>7s} {'regs':>4s} {'spill':>5s} {'smem':>6s} {'blocks/SM':>9s} {'warps/SM':>8s} {'waves':>6s}")
  for call in step_kernels(eng, a.step, rows, a.pos):
    name, _, src = render(call.src[0], ren)
    if name in seen: continue
    seen.add(name)
    threads = int(re.search(r"__launch_bounds__\((\d+)", src).group(1))
    (blocks, sym), (regs, spill, smem) = grid(src), compile_report(src, a.arch)
    b = blocks_per_sm(threads, regs, smem, a.arch)
    print(f"{name[:48]:48s} {threads:7d} {blocks:7d}{'+' if sym else ' '}{regs:4d} {spill:5d} {smem:6d} {b:9d} "
          f"{b * -(-threads // 32):8d} {blocks / (a.sms * b) if b else float('inf'):6.2f}")  # b 0: a block the SM cannot hold

if __name__ == "__main__": main()
