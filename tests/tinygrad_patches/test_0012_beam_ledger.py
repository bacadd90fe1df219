"""0012-beam-ledger: BEAM_LEDGER=path.jsonl appends one JSON line per searched kernel (name, heuristic and final
time, rounds, candidates compiled and timed, seconds, whether it was skipped as small), none for a cache hit."""
import json, os, subprocess, sys, textwrap

MATMUL = textwrap.dedent("""
  import numpy as np
  from tinygrad import Tensor
  a, b = Tensor(np.eye(32, dtype=np.float32)).realize(), Tensor(np.arange(32 * 32, dtype=np.float32).reshape(32, 32)).realize()
  np.testing.assert_allclose((a @ b).numpy(), np.arange(32 * 32).reshape(32, 32))
""")
FIELDS = {"trace", "name", "key", "device", "amt", "heuristic_us", "final_us", "heuristic_retimed_us", "kept_heuristic", "skipped_small",
          "rounds", "best_round", "compiled", "timed", "stalled_pools", "seconds", "opts"}

def run(tmp_path, **env) -> list[dict]:
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "IGNORE_BEAM_CACHE": "0", "CACHEDB": str(tmp_path / "cache.db"),
         "BEAM_LEDGER": str(tmp_path / "ledger.jsonl"), "BEAM_FROM_HEURISTIC": "1", "BEAM_MAX_ROUNDS": "1", **env}
  r = subprocess.run([sys.executable, "-"], input=MATMUL, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  ledger = tmp_path / "ledger.jsonl"
  return [json.loads(l) for l in ledger.read_text().splitlines()] if ledger.exists() else []

def test_ledger_lines(tmp_path):
  (tmp_path / "a").mkdir(); (tmp_path / "b").mkdir()
  searched = run(tmp_path / "a", BEAM_RETIME="2")
  assert len(searched) == 1 and FIELDS <= set(searched[0]), searched
  e = searched[0]
  assert e["device"] == "CPU" and e["amt"] == 1 and e["rounds"] == 1 and e["best_round"] in (0, 1) and not e["skipped_small"], e
  assert e["name"].startswith("r_"), e
  # with BEAM_RETIME the result is the fastest of the finalists timed again, the heuristic among them
  assert e["compiled"] >= e["timed"] > 0 and e["seconds"] > 0 and e["final_us"] <= e["heuristic_retimed_us"], e
  assert run(tmp_path / "a", BEAM_RETIME="2") == searched  # the second run finds the result in the cache: no search, no line

  small = run(tmp_path / "b", BEAM_MIN_US="1e9")
  assert len(small) == 1 and small[0]["skipped_small"] and small[0]["kept_heuristic"], small
  assert small[0]["rounds"] == small[0]["best_round"] == small[0]["compiled"] == small[0]["timed"] == 0, small
  assert small[0]["final_us"] == small[0]["heuristic_us"], small
  assert small[0]["heuristic_retimed_us"] is None, small
