"""0009-beam-key-sizes: BEAM's cache key leaves out global buffers' sizes and variables' bounds, so a kernel that
differs from a searched one only in those (a KV cache of another context length, a position variable bounded by it)
reuses the searched opts instead of searching again; cached opts that do not apply lead to a search, not an error."""
import os, subprocess, sys, textwrap

PRELUDE = textwrap.dedent("""
  import numpy as np
  from tinygrad import Tensor, UOp
  from tinygrad.codegen.opt import search, Opt, OptOps
  searched = []  # one entry per search that finished (its result is stored), none for a cache hit
  orig_put = search.diskcache_put
  def counting_put(table, key, val, *a, **kw):
    if table == "beam_search": searched.append(val)
    return orig_put(table, key, val, *a, **kw)
  search.diskcache_put = counting_put
  def rows(n): return np.arange(n * 16, dtype=np.float32).reshape(n, 16) / 100
""")

# the same sum over the first 8 rows of a (32, 16) and of a (64, 16) buffer: only the input's size differs
BUFFER_SIZE = PRELUDE + textwrap.dedent("""
  for n in (32, 64):
    x = Tensor(rows(n)).realize()
    np.testing.assert_allclose(((x[:8] * 2).sum(0)).numpy(), (rows(n)[:8] * 2).sum(0), rtol=1e-5)
    print("n", n, "searches", len(searched))
""")

# attention-like: a sum over the first T rows of a (64, 16) cache, T bounded by 32, then by 64: only the variable's bound differs
VAR_BOUND = PRELUDE + textwrap.dedent("""
  x = Tensor(rows(64)).realize()
  for hi in (32, 64):
    T = UOp.variable("T", 1, hi).bind(5)
    np.testing.assert_allclose(((x[:T] * 2).sum(0)).numpy(), (rows(64)[:5] * 2).sum(0), rtol=1e-5)
    print("hi", hi, "searches", len(searched))
""")

# a cached result whose opts do not apply to this kernel (UPCAST 7 of a 16-wide axis): searched instead
BAD_CACHE = PRELUDE + textwrap.dedent("""
  orig_get = search.diskcache_get
  search.diskcache_get = lambda table, key: [Opt(OptOps.UPCAST, 0, 7)] if table == "beam_search" else orig_get(table, key)
  x = Tensor(rows(32)).realize()
  np.testing.assert_allclose(((x[:8] * 2).sum(0)).numpy(), (rows(32)[:8] * 2).sum(0), rtol=1e-5)
  print("searches", len(searched))
""")

def run(src: str, tmp_path) -> subprocess.CompletedProcess:
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PARALLEL": "0", "IGNORE_BEAM_CACHE": "0", "CACHELEVEL": "2",
         "CACHEDB": str(tmp_path / "cache.db")}
  return subprocess.run([sys.executable, "-"], input=src, env=env, capture_output=True, text=True, timeout=600)

def test_buffer_size_reuses_search(tmp_path):
  r = run(BUFFER_SIZE, tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "n 32 searches 1" in r.stdout and "n 64 searches 1" in r.stdout, r.stdout

def test_variable_bound_reuses_search(tmp_path):
  r = run(VAR_BOUND, tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "hi 32 searches 1" in r.stdout and "hi 64 searches 1" in r.stdout, r.stdout

def test_cached_opts_that_do_not_apply_are_searched(tmp_path):
  r = run(BAD_CACHE, tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "searches 1" in r.stdout, r.stdout
