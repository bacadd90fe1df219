"""0035-beam-precompile: with BEAM on, the hand-coded opts of a batch's kernels are compiled in the worker pool first; the
parent's search of each kernel times that program instead of rendering and compiling it again, and where the hand-coded
opts are the result (a kernel under BEAM_MIN_US, or a search that found nothing faster) that program is the kernel's. A
quick prewarm of the 1B spent 47 of its 292 s compiling the hand-coded opts in the parent, one kernel after another, and
~55 s more rendering and compiling the same opts again as results (docs/PERF.md, twenty-fifth session).

Five kernels of one realize (matmuls, reductions, elementwise), really compiled and run on DEV=CPU with two workers, their
outputs compared with numpy float64; the BEAM timings are faked (deterministic per program) so that what is searched does
not depend on the machine. The parent's compiles are counted (Compiler.compile_cached). 0001-0034: the parent compiles
every kernel (the first test fails)."""
import json, os, subprocess, sys, textwrap
import pytest

SCRIPT = textwrap.dedent("""
  import json, sys, zlib
  import numpy as np
  from tinygrad import Tensor, device
  from tinygrad.codegen.opt import search
  # each program's time from its source: the same for the same code, and different opts rank differently
  fake = lambda prg: 1e-6 * (1 + zlib.crc32(prg.src[2].arg.encode()) % 97) if sys.argv[2] == "ranked" else 10e-6
  search._time_program = lambda prg, var_vals, rawbufs, early_stop=None, allow_test_size=True, cnt=3, **kw: [fake(prg)] * cnt
  calls = [0]
  orig = device.Compiler.compile_cached
  def counted(self, src):
    calls[0] += 1
    return orig(self, src)
  device.Compiler.compile_cached = counted
  rng = np.random.default_rng(int(sys.argv[1]))
  a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in [(24, 40), (40, 56), (56,)])
  ta, tb, tc = Tensor(a).realize(), Tensor(b).realize(), Tensor(c).realize()
  outs = [(ta @ tb).relu(), (ta @ tb + tc).sum(axis=0), (ta.exp() * 2).max(axis=1), ((ta @ tb) * tc).mean()]
  calls[0] = 0
  Tensor.realize(*outs)  # one batch of kernels to lower and compile
  n = calls[0]
  a64 = a.astype(np.float64)
  want = [np.maximum(a64 @ b, 0), (a64 @ b + c).sum(0), (np.exp(a64) * 2).max(1), ((a64 @ b) * c).mean()]
  for o, w in zip(outs, want): np.testing.assert_allclose(o.numpy(), w, rtol=1e-4, atol=1e-4)
  print(json.dumps({"parent_compiles": n}))
""")

def run(tmp_path, timing: str, db: str = "cache.db", **env) -> tuple[int, list[dict]]:
  (tmp_path / "pre.py").write_text(SCRIPT)
  ledger = tmp_path / f"ledger-{timing}-{len(list(tmp_path.iterdir()))}.jsonl"
  e = {**{k: v for k, v in os.environ.items() if not k.startswith("BEAM")}, "DEV": "CPU", "BEAM": "2", "PARALLEL": "2",
       "BEAM_MP_CTX": "forkserver", "CACHEDB": str(tmp_path / db), "BEAM_LEDGER": str(ledger), "BEAM_FROM_HEURISTIC": "1",
       "BEAM_MAX_ROUNDS": "1", **env}
  r = subprocess.run([sys.executable, str(tmp_path / "pre.py"), str(int.from_bytes(os.urandom(4), "little")), timing], env=e,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  entries = [json.loads(l) for l in ledger.read_text().splitlines()] if ledger.exists() else []
  return json.loads(r.stdout.strip().splitlines()[-1])["parent_compiles"], entries

def test_kernels_left_on_the_hand_coded_opts_are_compiled_in_the_pool(tmp_path):
  n, entries = run(tmp_path, "flat", BEAM_MIN_US="1e6", IGNORE_BEAM_CACHE="1")
  assert len(entries) >= 4 and all(e["skipped_small"] for e in entries), entries
  assert n == 0, f"the parent compiled {n} programs: the pool's were not used"

def test_off_the_parent_compiles_them(tmp_path):
  n, entries = run(tmp_path, "flat", BEAM_MIN_US="1e6", IGNORE_BEAM_CACHE="1", BEAM_PRECOMPILE="0")
  assert n >= len(entries) >= 4, (n, entries)

def test_searched_kernels_compute_the_same(tmp_path):
  """Searched with ranked fake timings (some kernels end on other opts than the hand-coded ones, compiled by the parent),
  then started again from the database: every output equals numpy's."""
  n, entries = run(tmp_path, "ranked", BEAM_MIN_US="0", IGNORE_BEAM_CACHE="1", BEAM_CHECK="1")
  assert any(not e["kept_heuristic"] for e in entries), entries
  assert n <= sum(not e["kept_heuristic"] for e in entries) * 2, (n, entries)  # kernels that kept the hand-coded opts: the pool's
  run(tmp_path, "ranked", BEAM_MIN_US="0", BEAM_CHECK="1")  # the database's results, each checked and run
