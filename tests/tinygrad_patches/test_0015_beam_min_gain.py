"""0015-beam-min-gain: BEAM_MIN_GAIN=g ends a search after a round whose best candidate is not at least a fraction g
faster than the best before it (the round's best is still kept).

A 64x64 matmul's candidates are really compiled (DEV=CPU, PARALLEL=0) but timed by a fake `_time_program`: each
applied opt makes a program a fraction `step` faster (drawn at random per run, either side of g), so that every round
finds a better candidate than the last. With a step under g the search ends after its second round (the first one
beats the unoptimized kernel by far); with a step over g, and without BEAM_MIN_GAIN, it runs to BEAM_MAX_ROUNDS.
Stock tinygrad (and 0001-0014) ignores BEAM_MIN_GAIN: the small steps run to BEAM_MAX_ROUNDS too."""
import json, os, random, subprocess, sys, textwrap

SEARCH = textwrap.dedent("""
  import json, os, sys
  from tinygrad import Tensor, Device
  from tinygrad.codegen.opt import search
  from tinygrad.codegen.opt.postrange import Scheduler, args_from_ast
  ast = (Tensor.empty(64, 64, device="CPU") @ Tensor.empty(64, 64, device="CPU")).schedule_linear().src[-1].src[0]
  s = Scheduler(ast, Device["CPU"].renderer)
  s.convert_loop_to_global()
  rawbufs, var_vals = args_from_ast(ast, "CPU")
  step = float(os.environ["FAKE_STEP"])
  def fake_time_program(prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw):
    return [10e-6 * (1 - step) ** len(prg.src[0].arg.applied_opts)] * cnt
  search._time_program = fake_time_program
  res = search.beam_search(s, rawbufs, var_vals, 2, disable_cache=True)
  print(json.dumps([str(o) for o in res.applied_opts]))
""")
MAX_ROUNDS = 4

def run(tmp_path, step: float, **env) -> tuple[list[str], dict]:
  (tmp_path / "search.py").write_text(SEARCH)
  ledger = tmp_path / "ledger.jsonl"
  ledger.unlink(missing_ok=True)
  env = {**os.environ, "DEV": "CPU", "PARALLEL": "0", "CACHEDB": str(tmp_path / "cache.db"), "BEAM_MAX_ROUNDS": str(MAX_ROUNDS),
         "BEAM_LEDGER": str(ledger), "FAKE_STEP": repr(step), **env}
  r = subprocess.run([sys.executable, str(tmp_path / "search.py")], env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  (line,) = ledger.read_text().splitlines()
  return json.loads(r.stdout.strip().splitlines()[-1]), json.loads(line)

def test_small_gains_end_the_search(tmp_path):
  gain = random.uniform(0.03, 0.08)
  small, large = random.uniform(0.002, gain * 0.8), random.uniform(gain * 1.3, 0.3)
  opts, e = run(tmp_path, small, BEAM_MIN_GAIN=repr(gain))
  assert e["rounds"] == 2 and len(opts) == 2, (small, gain, e)  # round 2 gained only `small`: the search ended, keeping its best
  assert e["best_round"] == 2, e
  _, e = run(tmp_path, large, BEAM_MIN_GAIN=repr(gain))
  assert e["rounds"] == MAX_ROUNDS, (large, gain, e)  # each round gained more than g
  _, e = run(tmp_path, small)
  assert e["rounds"] == MAX_ROUNDS, e  # no BEAM_MIN_GAIN: as before
