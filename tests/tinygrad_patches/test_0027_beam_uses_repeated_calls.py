"""0027-beam-uses-repeated-calls: `BEAM_USES` (0019) counts a kernel's calls in the program's list of calls. A call
repeated with the same buffers is a single UOp (tinygrad's UOps are hash-consed), so counted among the program's
distinct calls it was one use, however often it ran: in a captured prefill chunk step every layer's product reads and
writes the same buffers, and the 1B's 512-row chunk's Q/K/V product counted 2 uses of its 16, under BEAM_MIN_US and
never searched (docs/PERF.md, nineteenth session). Stock has no BEAM_USES; 0001-0026 give 1 here (the test fails).

A program is built from a real schedule (a matmul on the CPU) with its one call repeated a random number of times,
then lowered and compiled with the compile step recording the context each kernel is compiled under."""
import os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import sys
  from tinygrad import Tensor
  from tinygrad.uop.ops import Ops
  from tinygrad.helpers import BEAM_USES
  import tinygrad.engine.realize as R
  n = int(sys.argv[1])
  seen = []
  compile_kernel = R._compile_kernel
  def recording(task):
    seen.append(task[2].get(BEAM_USES.key))
    return compile_kernel(task)
  R._compile_kernel = recording
  linear = (Tensor.empty(32, 48) @ Tensor.empty(48, 16)).linear_with_vars()[0]
  calls = [c for c in linear.src if c.op is Ops.CALL and R._get_call_to_compile(c) is not None]
  assert len(calls) == 1, calls
  R.lower_and_compile(linear.replace(src=tuple(linear.src) + (calls[0],) * (n - 1)))
  print(seen)
""")

def test_a_call_repeated_with_the_same_buffers_counts_each_time(rng):
  n = int(rng.integers(2, 17))
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "0"}
  r = subprocess.run([sys.executable, "-c", SCRIPT, str(n)], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip().splitlines()[-1] == f"[{n}]", (n, r.stdout)
