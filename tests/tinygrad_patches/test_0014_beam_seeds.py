"""0014-beam-seeds: BEAM_SEEDS=1 times the opts that earlier searches chose (this process's, and the results in the cache
database for the device) before the first round, beside the hand-coded opts; where one of them is faster, the search
starts from it and runs at most BEAM_SEED_ROUNDS rounds more (0: none). Kernels of one family (a weight's product at
another chunk size or batch) take much the same opts, so their searches are short.

Two matmuls of one family but other sizes (A: 32x32, B: 64x64). The candidates are really compiled (DEV=CPU,
PARALLEL=0) but timed by a fake `_time_program`: two opts (UPCAST 2 of either axis) make a program faster, any other
opt slower, so that A's search ends with those two (not its hand-coded opts), and A's result, as a seed, beats B's
hand-coded opts. Stock tinygrad ignores BEAM_SEEDS: B is
searched from nothing (rounds >= 1) and writes no seed fields."""
import json, os, subprocess, sys, textwrap

SEARCH = textwrap.dedent("""
  import json, sys
  from tinygrad import Tensor, Device
  from tinygrad.codegen.opt import search
  from tinygrad.codegen.opt.heuristic import hand_coded_optimizations
  from tinygrad.codegen.opt.postrange import Scheduler, args_from_ast
  def kernel(n):
    ast = (Tensor.empty(n, n, device="CPU") @ Tensor.empty(n, n, device="CPU")).schedule_linear().src[-1].src[0]
    s = Scheduler(ast, Device["CPU"].renderer)
    s.convert_loop_to_global()
    return s, *args_from_ast(ast, "CPU")
  timed, P = [], {"Opt(op=OptOps.UPCAST, axis=0, arg=2)", "Opt(op=OptOps.UPCAST, axis=1, arg=2)"}
  def fake_time_program(prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw):
    opts = tuple(prg.src[0].arg.applied_opts)
    timed.append(o:=[str(o) for o in opts])
    return [10e-6 - 1e-6 * len(P.intersection(o)) + 0.1e-6 * len(set(o) - P)] * cnt
  search._time_program = fake_time_program
  out = {}
  for name in sys.argv[1:]:
    s, rawbufs, var_vals = kernel({"A": 32, "B": 64}[name])
    timed.clear()
    out[name] = {"res": [str(o) for o in search.beam_search(s, rawbufs, var_vals, 2, disable_cache=True).applied_opts],
                 "H": [str(o) for o in hand_coded_optimizations(s).applied_opts], "timed": list(timed)}
  print(json.dumps(out))
""")

def run(tmp_path, *kernels: str, **env) -> tuple[dict, list[dict]]:
  (tmp_path / "search.py").write_text(SEARCH)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "0", "CACHEDB": str(tmp_path / "cache.db"), "BEAM_FROM_HEURISTIC": "1",
         "BEAM_MAX_ROUNDS": "4", "BEAM_LEDGER": str(tmp_path / "ledger.jsonl"), **env}
  (tmp_path / "ledger.jsonl").unlink(missing_ok=True)
  r = subprocess.run([sys.executable, str(tmp_path / "search.py"), *kernels], env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1]), [json.loads(l) for l in (tmp_path / "ledger.jsonl").read_text().splitlines()]

def test_a_seed_from_this_process_starts_the_search(tmp_path):
  out, ledger = run(tmp_path, "A", "B", BEAM_SEEDS="8", BEAM_SEED_ROUNDS="0")
  a, b = out["A"], out["B"]
  assert a["res"] != b["H"], (a, b)  # A's search went past its hand-coded opts, which B shares
  assert b["res"] == a["res"], b  # B's search adopted A's result, with no round after it
  la, lb = ledger
  assert la["seeds"] == 0 and not la["seeded"] and la["rounds"] >= 1, la  # nothing to seed A from
  assert lb["seeds"] >= 1 and lb["seeded"] and lb["rounds"] == 0 and not lb["skipped_small"], lb
  assert lb["compiled"] == 0, lb  # no round: only the heuristic and the seeds were compiled

def test_seed_rounds_bound_the_search_after_a_seed(tmp_path):
  _, ledger = run(tmp_path, "A", "B", BEAM_SEEDS="8", BEAM_SEED_ROUNDS="1")
  assert ledger[1]["seeded"] and ledger[1]["rounds"] == 1, ledger[1]
  (tmp_path / "plain").mkdir()
  _, ledger = run(tmp_path / "plain", "A", "B")  # without seeds B is searched whole: rounds until no opt helps
  assert ledger[1]["rounds"] > 1 and not ledger[1].get("seeds"), ledger[1]

def test_seeds_from_the_cache_database(tmp_path):
  run(tmp_path, "A", BEAM_SEEDS="8")  # A's result stored in cache.db
  out, ledger = run(tmp_path, "B", BEAM_SEEDS="8", BEAM_SEED_ROUNDS="0")  # a new process: its seeds come from the database
  assert ledger[0]["seeds"] >= 1 and ledger[0]["seeded"] and out["B"]["res"] != out["B"]["H"], ledger
