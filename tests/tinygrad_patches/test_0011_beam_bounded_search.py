"""0011-beam-bounded-search: BEAM search knobs, all off by default (stock behaviour):
BEAM_FROM_HEURISTIC=1 (the hand-coded opts are timed first and start the beam), BEAM_MIN_US=x (a kernel under x us with
them is not searched), BEAM_MAX_ROUNDS=n, BEAM_TIME_LIMIT=s (the best so far after n rounds / s seconds), BEAM_RETIME=n
(the n best and the heuristic timed again, BEAM_RETIME_CNT times on the full grid, the fastest kept).

The candidates are really compiled (DEV=CPU, PARALLEL=0) but timed by a fake `_time_program` that derives a time from
the opts a program carries, so every search is deterministic."""
import json, os, subprocess, sys, textwrap

SEARCH = textwrap.dedent("""
  import hashlib, json, sys, time
  from tinygrad import Tensor, Device
  from tinygrad.codegen.opt import search
  from tinygrad.codegen.opt.heuristic import hand_coded_optimizations
  from tinygrad.codegen.opt.postrange import Scheduler, args_from_ast
  MODE = sys.argv[1]
  ast = (Tensor.empty(32, 32, device="CPU") @ Tensor.empty(32, 32, device="CPU")).schedule_linear().src[-1].src[0]
  s = Scheduler(ast, Device["CPU"].renderer)
  s.convert_loop_to_global()
  H = tuple(hand_coded_optimizations(s).applied_opts)
  rawbufs, var_vals = args_from_ast(ast, "CPU")
  calls = []  # (opts, cnt, allow_test_size) of every timing
  def h(opts): return int(hashlib.md5(str(opts).encode()).hexdigest(), 16) % 1000
  def fake_time(opts, cnt):
    if MODE in ("heuristic", "min_us"): return 10e-6 if opts == H else 20e-6
    if MODE in ("rounds", "time_limit"):  # each opt added helps, up to 4
      if MODE == "time_limit": time.sleep(0.05)
      return 10e-6 / (1 + min(len(opts), 4))
    if MODE == "retime":  # the order reverses at cnt 10; the heuristic is the slowest at first, so it is retimed as the 4th
      return (30e-6 if opts == H else 10e-6 + h(opts) * 1e-9) if cnt < 10 else (20e-6 - h(opts) * 1e-9)
  def fake_time_program(prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw):
    opts = tuple(prg.src[0].arg.applied_opts)
    calls.append((opts, cnt, allow_test_size))
    return [fake_time(opts, cnt)] * cnt
  search._time_program = fake_time_program
  st = time.perf_counter()
  res = tuple(search.beam_search(s, rawbufs, var_vals, 2, disable_cache=MODE != "min_us").applied_opts)
  elapsed = time.perf_counter() - st
  if MODE == "min_us":  # the heuristic's opts were stored as the result: found without timing anything
    n = len(calls)
    again = tuple(search.beam_search(s, rawbufs, var_vals, 2).applied_opts)
    assert again == H and len(calls) == n, (again, H, len(calls), n)
  print(json.dumps({"H": [str(o) for o in H], "res": [str(o) for o in res], "elapsed": elapsed,
                    "calls": [[[str(o) for o in c[0]], c[1], c[2], h(c[0])] for c in calls]}))
""")

def run(tmp_path, mode: str, **env) -> dict:
  (tmp_path / "search.py").write_text(SEARCH)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "0", "CACHEDB": str(tmp_path / "cache.db"), **env}
  r = subprocess.run([sys.executable, str(tmp_path / "search.py"), mode], env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_from_heuristic(tmp_path):
  out = run(tmp_path, "heuristic", BEAM_FROM_HEURISTIC="1", BEAM_MAX_ROUNDS="1")
  H, calls = out["H"], out["calls"]
  assert len(H) >= 2, H  # the heuristic is more than one opt: not a candidate of the unoptimized kernel's first round
  assert calls[0][0] == H, calls[0]  # timed first
  assert any(len(c[0]) == len(H) + 1 and c[0][:len(H)] == H for c in calls), "the beam did not start from the heuristic"
  assert any(len(c[0]) == 1 for c in calls), "with BEAM=2 the unoptimized kernel is in the beam too"
  assert out["res"] == H, out["res"]  # nothing was faster

def test_min_us_skips_search(tmp_path):
  out = run(tmp_path, "min_us", BEAM_MIN_US="15", IGNORE_BEAM_CACHE="0")
  assert out["res"] == out["H"] and [c[0] for c in out["calls"]] == [out["H"]], out["calls"]

def test_max_rounds(tmp_path):
  out = run(tmp_path, "rounds", BEAM_MAX_ROUNDS="2")
  assert len(out["res"]) == 2, out["res"]  # stock goes on to 4 opts

def test_time_limit(tmp_path):
  out = run(tmp_path, "time_limit", BEAM_TIME_LIMIT="2")
  assert out["elapsed"] < 8 and 1 <= len(out["res"]) < 4, (out["elapsed"], out["res"])

def test_retime_picks_the_fastest_of_careful_timings(tmp_path):
  out = run(tmp_path, "retime", BEAM_RETIME="3", BEAM_MAX_ROUNDS="1", BEAM_FROM_HEURISTIC="1")
  retimed = [c for c in out["calls"] if c[1] == 10]
  assert len(retimed) == 4 and all(c[2] is False for c in retimed), retimed  # 3 best + the heuristic, full grid
  assert out["H"] in [c[0] for c in retimed]
  first = {tuple(c[0]): c[3] for c in out["calls"] if c[1] == 3 and c[0] != out["H"]}
  assert sorted(first[tuple(c[0])] for c in retimed if c[0] != out["H"]) == sorted(first.values())[:3]  # the 3 best
  assert out["res"] == max(retimed, key=lambda c: c[3])[0]  # the fastest retimed (times reverse at cnt 10)
