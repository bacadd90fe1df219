"""0028-beam-small-searched-when-called-more: a kernel that BEAM_MIN_US left unsearched because the program that met it
first called it a few times is searched when a later program calls it often enough. The search's result (the hand-coded
opts) used to serve every later program, from tinygrad's in-process program cache and from the database: the 1B's
decode step runs its RMSNorm kernel 33 times, but the prefill chunk step compiled first ran it once (for its last
row), and the decode step's norms were never searched (docs/PERF.md, twentieth session). Stock has no BEAM_MIN_US;
0001-0027 search nothing the second time here (the tests fail).

The matmuls are really compiled and run (DEV=CPU, PARALLEL=0) and checked against numpy in float64, but timed by a fake
`_time_program` (10 us each), so which kernel is searched does not depend on the machine's speed: under
BEAM_MIN_US=50, one call is not searched and eight are."""
import json, os, subprocess, sys, textwrap
import pytest

SCRIPT = textwrap.dedent("""
  import sys
  import numpy as np
  from tinygrad import Tensor
  from tinygrad.codegen.opt import search
  search._time_program = lambda prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw: [10e-6] * cnt
  rng = np.random.default_rng(int(sys.argv[2]))
  w = rng.standard_normal((32, 32), dtype=np.float32)
  tw = Tensor(w).realize()
  for n in map(int, sys.argv[1].split(",")):  # one program each: the same matmul kernel, one call per input
    xs = [rng.standard_normal((32, 32), dtype=np.float32) for _ in range(n)]
    outs = [Tensor(x).realize() @ tw for x in xs]
    Tensor.realize(*outs)
    for x, o in zip(xs, outs): np.testing.assert_allclose(o.numpy(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
""")

def run(tmp_path, calls: str, tag: str) -> list[dict]:
  """Runs programs calling the matmul kernel `calls` times each (comma-separated), in one process with the database in
  tmp_path; the matmul's ledger lines (one per search or decision not served from a cache)."""
  (tmp_path / "calls.py").write_text(SCRIPT)
  led = tmp_path / f"ledger-{tag}.jsonl"
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "CACHEDB": str(tmp_path / "cache.db"), "BEAM_LEDGER": str(led),
         "BEAM_FROM_HEURISTIC": "1", "BEAM_MAX_ROUNDS": "1", "BEAM_MIN_US": "50"}
  env.pop("IGNORE_BEAM_CACHE", None)
  r = subprocess.run([sys.executable, str(tmp_path / "calls.py"), calls, str(int.from_bytes(os.urandom(4), "little"))], env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return [e for l in (led.read_text().splitlines() if led.exists() else []) if (e:=json.loads(l))["name"].startswith("r_")]

def test_a_kernel_met_first_with_few_calls_is_searched_when_a_later_program_calls_it_more(tmp_path):
  first, second = run(tmp_path, "1,8", "a")
  assert first["uses"] == 1 and first["skipped_small"], first
  assert second["uses"] == 8 and not second["skipped_small"] and second["rounds"] > 0, second
  # searched once: the result serves later programs of either count, in this process and in the next
  assert run(tmp_path, "8,1,8", "b") == []

def test_the_database_keeps_what_was_left_unsearched_for_its_few_calls(tmp_path):
  (first,) = run(tmp_path, "1", "a")
  assert first["skipped_small"], first
  assert run(tmp_path, "1", "b") == []  # still few calls: the database's decision, nothing timed
  (searched,) = run(tmp_path, "8", "c")  # a new process, more calls: searched now
  assert searched["uses"] == 8 and searched["rounds"] > 0, searched
  assert run(tmp_path, "8", "d") == []

@pytest.mark.parametrize("calls", ["8", "8,1"])
def test_a_kernel_searched_first_is_not_searched_again(tmp_path, calls):
  (searched,) = run(tmp_path, calls, "a")
  assert searched["uses"] == 8 and searched["rounds"] > 0, searched
