"""0037-beam-ledger-improvements: each BEAM_LEDGER line lists the search's improvements, (seconds since its start,
candidates timed so far, time in us) each time a candidate beat every program timed before it (the hand-coded opts and
the seeds included): when in a search its gains came, and so what ending it earlier would have lost. The quick
prewarm's twelve searches (docs/PERF.md, twenty-fifth session) recorded only each round's best: whether a search that
gives up early loses anything could not be told from them.

A matmul searched with BEAM=2 on DEV=CPU, BEAM's timings faked per program (deterministic, from its source), so that
the candidates rank differently from the hand-coded opts. 0001-0036: no "improvements" in the ledger (the test fails)."""
import json, os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import sys, zlib
  import numpy as np
  from tinygrad import Tensor
  from tinygrad.codegen.opt import search
  fake = lambda prg: 1e-6 * (1 + zlib.crc32(prg.src[2].arg.encode()) % 997) if sys.argv[1] == "ranked" else 10e-6
  search._time_program = lambda prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw: [fake(prg)] * cnt
  rng = np.random.default_rng(int(sys.argv[2]))
  a, b = rng.standard_normal((48, 40), dtype=np.float32), rng.standard_normal((40, 56), dtype=np.float32)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
""")

def ledger(tmp_path, timing: str) -> list[dict]:
  (tmp_path / "s.py").write_text(SCRIPT)
  out = tmp_path / f"{timing}.jsonl"
  env = {**{k: v for k, v in os.environ.items() if not k.startswith("BEAM")}, "DEV": "CPU", "BEAM": "2", "PARALLEL": "0",
         "IGNORE_BEAM_CACHE": "1", "CACHEDB": str(tmp_path / "c.db"), "BEAM_LEDGER": str(out), "BEAM_FROM_HEURISTIC": "1", "BEAM_MAX_ROUNDS": "2"}
  r = subprocess.run([sys.executable, str(tmp_path / "s.py"), timing, str(int.from_bytes(os.urandom(4), "little"))], env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return [e for l in out.read_text().splitlines() if (e:=json.loads(l))["name"].startswith("r_")]

def test_improvements_are_the_running_best(tmp_path):
  (e,) = ledger(tmp_path, "ranked")
  imp = e["improvements"]
  assert imp, e  # 997 ranks: some candidate beats the hand-coded opts
  secs, counts, us = zip(*imp)
  assert list(us) == sorted(us, reverse=True) and len(set(us)) == len(us) and us[0] < e["heuristic_us"], imp
  assert list(counts) == sorted(counts) and counts[-1] <= e["timed"] and list(secs) == sorted(secs) and secs[-1] <= e["seconds"], (imp, e)

def test_nothing_better_no_improvements(tmp_path):
  (e,) = ledger(tmp_path, "flat")
  assert e["improvements"] == [] and e["kept_heuristic"], e
