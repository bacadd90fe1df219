"""0029-beam-check-outputs: with BEAM_CHECK=1 a search's result is run beside the hand-coded opts' program on the same
random inputs and dropped where the outputs disagree; a result from the database is checked the same way and searched
again. A result that passed is marked in the database and not checked again at the next start. BEAM never compared a candidate's output with anything: a searched kernel once computed a wrong product, and the
1B's compiled prefill failed its check on a fresh database (docs/PERF.md, seventeenth and twenty-second sessions).

A wrong candidate is made here: every candidate the search compiles (not the hand-coded opts) gets the program of the
kernel with its output doubled, and a fake `_time_program` makes those the fastest. The real matmul is compiled and run
(DEV=CPU, PARALLEL=0) and checked against numpy in float64 either way (the final kernel is compiled from the real AST).
Stock and 0001-0028 keep a doubled candidate (the tests fail); with 0029 every one is dropped and the hand-coded opts
are the result."""
import json, os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import sys
  import numpy as np
  from tinygrad import Tensor
  from tinygrad.uop.ops import Ops
  from tinygrad.codegen.opt import search
  bad = set()
  def doubled(s):  # the scheduler's opts on the kernel with its stored values doubled (argv[2] == "1"), else as is
    w = s.copy()  # its AST carries the opts applied so far
    if sys.argv[2] == "1": w.ast = w.ast.substitute({u: u.replace(src=(u.src[0], u.src[1] * 2) + u.src[2:]) for u in w.ast.toposort() if u.op is Ops.STORE})
    return w
  real_compile = search._try_compile
  def wrong_compile(x):  # every candidate the search compiles
    i, ret = real_compile((x[0], doubled(x[1])))
    if ret is not None: bad.add(ret[0].src[3].arg)
    return i, ret
  search._try_compile = wrong_compile
  if hasattr(search, "_program"):  # the check's own compiles (0029): wrong unless the opts are the hand-coded ones
    from tinygrad.device import Device
    from tinygrad.codegen.opt.postrange import Scheduler
    from tinygrad.codegen.opt.heuristic import hand_coded_optimizations
    [ast] = [c.src[0] for c in (Tensor.empty(32, 64) @ Tensor.empty(64, 48)).linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
    k = Scheduler(ast, Device["CPU"].renderer)
    k.convert_loop_to_global()
    hand = tuple(hand_coded_optimizations(k).applied_opts)
    real_program = search._program
    search._program = lambda h: real_program(h if tuple(h.applied_opts) == hand else doubled(h))
  def fake_time(prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw):
    return [(1e-6 if prg.src[3].arg in bad else 10e-6)] * cnt
  search._time_program = fake_time
  runs = [0]
  if hasattr(search, "_check_run"):  # the check's program runs, counted (0029)
    real_run = search._check_run
    def counted_run(*a, **kw):
      runs[0] += 1
      return real_run(*a, **kw)
    search._check_run = counted_run
  rng = np.random.default_rng(int(sys.argv[1]))
  a, b = rng.standard_normal((32, 64), dtype=np.float32), rng.standard_normal((64, 48), dtype=np.float32)
  out = (Tensor(a).realize() @ Tensor(b).realize()).numpy()
  np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
  print(f"check runs: {runs[0]}")
""")

def run(tmp_path, tag: str, check: bool, wrong: bool = True) -> tuple[list[dict], str]:
  (tmp_path / "wrong.py").write_text(SCRIPT)
  led = tmp_path / f"ledger-{tag}.jsonl"
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "CACHEDB": str(tmp_path / "cache.db"), "BEAM_LEDGER": str(led),
         "BEAM_FROM_HEURISTIC": "1", "BEAM_MAX_ROUNDS": "1", "BEAM_CHECK": "1" if check else "0"}
  for k in ("IGNORE_BEAM_CACHE", "BEAM_MIN_US", "BEAM_SEEDS"): env.pop(k, None)
  r = subprocess.run([sys.executable, str(tmp_path / "wrong.py"), str(int.from_bytes(os.urandom(4), "little")), "1" if wrong else "0"], env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  lines = [e for l in (led.read_text().splitlines() if led.exists() else []) if (e:=json.loads(l))["name"].startswith("r_")]
  return lines, r.stdout

def test_a_candidate_that_computes_something_else_is_dropped(tmp_path):
  (line,), out = run(tmp_path, "a", check=True)
  assert line["rounds"] > 0 and line["rejected"] >= 1 and line["kept_heuristic"], line
  assert "BEAM_CHECK" in out and "dropped" in out, out[-2000:]

def test_without_the_check_the_wrong_candidate_is_kept(tmp_path):
  """What the check guards against (the fake works): unchecked, the fastest candidate is a doubling one."""
  (line,), _ = run(tmp_path, "a", check=False)
  assert line["rounds"] > 0 and not line["kept_heuristic"], line

def test_a_wrong_result_in_the_database_is_searched_again(tmp_path):
  (unchecked,), _ = run(tmp_path, "a", check=False)  # the database now holds a doubling candidate's opts
  assert not unchecked["kept_heuristic"], unchecked
  (line,), out = run(tmp_path, "b", check=True)
  assert "searching again" in out and line["rejected"] >= 1 and line["kept_heuristic"], (line, out[-2000:])

def test_a_checked_result_is_not_checked_again(tmp_path):
  """A start on a database the check has seen runs no check: checking every result again took 80 s of a 1B's start.
  Here the candidates compute the product (not doubled): the fastest is checked, agrees and is kept."""
  (line,), out = run(tmp_path, "a", check=True, wrong=False)
  assert line["rejected"] == 0 and not line["kept_heuristic"] and "check runs: 0" not in out, (line, out[-2000:])
  lines, out = run(tmp_path, "b", check=True, wrong=False)  # the same kernel: the database's result, marked checked
  assert lines == [] and "check runs: 0" in out and "BEAM_CHECK" not in out, (lines, out[-2000:])

def test_check_inputs_fill_each_buffer_to_its_size():
  """The check's inputs take each buffer's own byte size: bfloat16 and fp8, which tinygrad maps to numpy's float32,
  took 2 and 4 times theirs, and the copy into the device buffer ran past its end. Only stored-to buffers compare."""
  import numpy as np
  from tinygrad import Tensor, dtypes
  from tinygrad.device import Buffer
  from tinygrad.uop.ops import Ops
  from tinygrad.codegen.opt.postrange import args_from_ast
  from tinygrad.codegen.opt import search
  bufs = [Buffer("CPU", 10, dt) for dt in (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.float16, dtypes.float32, dtypes.int32, dtypes.bool)]
  for b, x in zip(bufs, search._check_inputs(bufs, int.from_bytes(os.urandom(4), "little"))):
    assert x.nbytes == b.nbytes, (b.dtype, x.nbytes, b.nbytes)
  assert np.unique(search._check_inputs(bufs, 1)[2]).size > 1  # float16: random, not zeros
  [ast] = [c.src[0] for c in (Tensor.empty(8, 16) @ Tensor.empty(16, 4)).linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  rawbufs, _ = args_from_ast(ast, "CPU")
  assert search._check_outputs(ast, len(rawbufs)) == [0] and rawbufs[0].size == 32
