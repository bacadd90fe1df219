"""0019-beam-min-us-per-use: BEAM_MIN_US weighs a kernel's time by how many calls of the program being compiled run it
(lower_and_compile counts them; `BEAM_USES` in the ledger). A decode step runs each layer's kernels once a layer: judged
alone, the 1B's Q/K/V matvec (37 us with the hand-coded opts on an H100, 16 a step) was under the 40 us floor and never
searched, and decode ran at 520 tok/s; searching the step's kernels gave 702 (twelfth session, docs/PERF.md).

The matmuls are really compiled and run (DEV=CPU, PARALLEL=0) but timed by a fake `_time_program` (10 us each), so which
kernel is searched does not depend on the machine's speed."""
import json, os, subprocess, sys, textwrap
import pytest

SCRIPT = textwrap.dedent("""
  import sys
  import numpy as np
  from tinygrad import Tensor
  from tinygrad.codegen.opt import search
  search._time_program = lambda prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw: [10e-6] * cnt
  rng = np.random.default_rng(int(sys.argv[2]))
  xs = [rng.standard_normal((32, 32), dtype=np.float32) for _ in range(int(sys.argv[1]))]
  w = rng.standard_normal((32, 32), dtype=np.float32)
  tw = Tensor(w).realize()
  outs = [Tensor(x).realize() @ tw for x in xs]
  Tensor.realize(*outs)  # one program: the same matmul kernel, one call per input
  for x, o in zip(xs, outs): np.testing.assert_allclose(o.numpy(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
""")

def ledger(tmp_path, n: int) -> list[dict]:
  (tmp_path / "uses.py").write_text(SCRIPT)
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "IGNORE_BEAM_CACHE": "1", "CACHEDB": str(tmp_path / "cache.db"),
         "BEAM_LEDGER": str(tmp_path / f"ledger{n}.jsonl"), "BEAM_FROM_HEURISTIC": "1", "BEAM_MAX_ROUNDS": "1", "BEAM_MIN_US": "50"}
  r = subprocess.run([sys.executable, str(tmp_path / "uses.py"), str(n), str(int.from_bytes(os.urandom(4), "little"))], env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return [e for l in (tmp_path / f"ledger{n}.jsonl").read_text().splitlines() if (e:=json.loads(l))["name"].startswith("r_")]

@pytest.mark.parametrize("n,searched", [(1, False), (8, True)])
def test_a_kernel_run_often_is_searched(tmp_path, n, searched):
  matmuls = ledger(tmp_path, n)
  assert len(matmuls) == 1, matmuls  # one kernel, compiled (and searched or not) once for all its calls
  e = matmuls[0]
  assert e.get("uses") == n, e
  # 10 us alone is under BEAM_MIN_US=50: the hand-coded opts are the result; 8 calls of 10 us are not
  assert e["skipped_small"] is (not searched) and (e["rounds"] > 0) is searched, e
