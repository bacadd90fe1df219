"""0033-rows-over-keys-grouped: rows reduced over cached keys (the row maxima and sums of a prefill chunk's or the group
step's attention scores: a block of 256 keys times a count of blocks that follows the position) share each block's keys
among a row's threads: GROUP 16 and 4 of the 256 keys, 4 of them unrolled. Each thread walked one row's keys alone: the
1B's 512-row chunk's row maxima took 296 us a layer at the search's midpoint, 76 us with BEAM's pick (H200); as the
hand-coded opts, at BEAM=0 pp512 +4.9% and pp2048 +9.9% (docs/PERF.md, twenty-fifth session). Where there are few rows
(<= 2048, a decode step's), tinygrad's GROUPTOP applies as before.

The opts come from a CUDA renderer constructed without a GPU (sm_87), for the form of orin_llm's scores (the block count
symbolic); RED_KEYS=0 keeps the old rules' opts. The numerics run on tinygrad's CUDA-flavoured emulator (DEV=PYTHON) on
fresh random scores against numpy. 0001-0032: no GROUP in the opts (the first test fails)."""
import json, os, subprocess, sys, textwrap
import pytest

ROWS = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor, UOp
  R, NB, op, render, seed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "render", int(sys.argv[5])
  xs = np.random.default_rng(seed).standard_normal((NB, R, 256)).astype(np.float32)
  x = Tensor(xs, device="CPU" if render else None).realize()
  nb = UOp.variable("start_pos", 0, (NB - 1) * 256) // 256 + 1 if render else NB
  blocks = x[0:nb]  # (blocks, rows, 256 keys): a row's scores, a block of keys after another, as the chunk's are laid out
  out = blocks.max(axis=(0, 2)) if op == "max" else blocks.exp().sum(axis=(0, 2))
  if render:
    from tinygrad.codegen import full_rewrite_to_sink
    from tinygrad.helpers import Target
    from tinygrad.renderer.cstyle import CUDARenderer
    from tinygrad.uop.ops import Ops
    ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
    for call in out.contiguous().linear_with_vars()[0].src:
      if call.src[0].op is Ops.SINK: print(json.dumps([[o.op.name, o.axis, o.arg] for o in full_rewrite_to_sink(call.src[0], ren).arg.applied_opts]))
  else:
    want = xs.astype(np.float64).max(axis=(0, 2)) if op == "max" else np.exp(xs.astype(np.float64)).sum(axis=(0, 2))
    print(json.dumps(float(np.abs(out.numpy() - want).max() / np.abs(want).max())))
''')

def run(*args, env=None):
  r = subprocess.run([sys.executable, "-c", ROWS, *map(str, args), str(int.from_bytes(os.urandom(4), "little"))], capture_output=True,
                     text=True, timeout=900, env=dict({k: v for k, v in os.environ.items() if k != "RED_KEYS"}, **(env or {})))
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

@pytest.mark.parametrize("rows,op", [(16384, "max"), (4096, "max"), (16384, "sum")])  # the 1B's 512-row chunk and the group step
def test_rows_over_keys_share_the_keys(rows, op):
  opts = run(rows, 4, op, "render")
  assert opts[:3] == [["GROUP", 1, 16], ["GROUP", 1, 4], ["UNROLL", 0, 4]], opts
  assert not any(o[0] == "GROUP" for o in run(rows, 4, op, "render", env={"RED_KEYS": "0"}))

def test_few_rows_keep_grouptop():
  """A decode step's rows (1024: the 1B's 32 query heads' ... under 2048): tinygrad's GROUPTOP, with or without the rule."""
  assert run(1024, 4, "max", "render") == run(1024, 4, "max", "render", env={"RED_KEYS": "0"})

@pytest.mark.parametrize("op", ["max", "sum"])
def test_grouped_rows_compute_the_reduce(op):
  assert run(2304, 1, op, "emulate", env={"DEV": "PYTHON"}) < 1e-5
