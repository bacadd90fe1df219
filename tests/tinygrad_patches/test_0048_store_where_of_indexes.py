"""0048-store-where-of-indexes: a store whose target is a concatenation of slices of one buffer, each at its own
symbolic offset (orin_llm's KV-cache rows of several sequences, each at its position: model.ONE_STORE), is one kernel
after rangeify, its target a WHERE of INDEXes that picks each row's place; codegen's memory_coalescing took only an
INDEX and asserted ("memory coalescing should be on INDEX"). The patch rewrites WHERE(c, INDEX(buf, i), INDEX(buf, j))
into INDEX(buf, WHERE(c, i, j)) first. On tinygrad's CPU backend against numpy on fresh random caches, rows and
positions: one kernel writes the rows where they belong and nothing else, also under TinyJit with the positions
rebound each call; STORE_WHERE_INDEX=0 (the rule off, as in 0001-0047): the compile fails."""
import json, os, subprocess, sys, textwrap

STORE = textwrap.dedent('''
  import json, sys
  import numpy as np
  from tinygrad import Tensor, TinyJit, UOp, dtypes
  from tinygrad.helpers import GlobalCounters
  CAP, SL, KVH, HD = 64, int(sys.argv[1]), 2, 8
  B, T, seed, one = SL, int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "one"
  rng = np.random.default_rng(seed)
  init = rng.standard_normal((CAP, SL, 2, KVH, HD)).astype(np.float16)
  cache = Tensor(init).contiguous().realize()
  vs = [UOp.variable(f"start{b}", 0, CAP - T) for b in range(B)]
  def store(new, *starts):
    views = [cache[s:s + T, b:b + 1] for b, s in enumerate(starts)]
    src = (new.float() * 1.0).cast(dtypes.float16).reshape(B, T, 2, KVH, HD).permute(1, 0, 2, 3, 4)
    stores = [views[0].cat(*views[1:], dim=1).uop.store(src.uop)] if one else [v.uop.store(src[:, b:b + 1].uop) for b, v in enumerate(views)]
    return Tensor(cache.uop.after(*stores)).sum().realize()
  step, want, kernels, ok = TinyJit(store), init.copy(), [], []
  for call in range(4):
    pos = [int(p) for p in rng.choice(CAP - T + 1, B, replace=False)]
    new = rng.standard_normal((B, T, 2, KVH, HD)).astype(np.float16)
    for b, p in enumerate(pos): want[p:p + T, b] = new[b]
    GlobalCounters.reset()
    step(Tensor(new).realize(), *[v.bind(p) for v, p in zip(vs, pos)])
    kernels.append(GlobalCounters.kernel_count)
    ok.append(bool(np.array_equal(cache.numpy(), want)))
  print(json.dumps({"kernels": kernels, "ok": ok}))
''')

def run(*args, **env) -> subprocess.CompletedProcess:
  r = subprocess.run([sys.executable, "-c", STORE, *map(str, args)], env=dict(os.environ, DEV="CPU", **env), capture_output=True, text=True, timeout=300)
  return r

def test_rows_at_their_own_positions_in_one_kernel(rng):
  for B, T in ((4, 1), (3, 1 + int(rng.integers(1, 4)))):
    out = {}
    for form in ("one", "each"):  # one store of the slices side by side; a store per row (the form before)
      r = run(B, T, int(rng.integers(1 << 31)), form)
      assert r.returncode == 0, r.stderr[-3000:]
      out[form] = json.loads(r.stdout.strip().splitlines()[-1])
      assert all(out[form]["ok"]), (form, out)
    # the captured step's replays (calls 3 and 4): B - 1 kernels fewer
    assert [e - o for o, e in zip(out["one"]["kernels"][2:], out["each"]["kernels"][2:])] == [B - 1] * 2, out

def test_without_the_rule_the_compile_fails(rng):
  r = run(4, 1, int(rng.integers(1 << 31)), "one", STORE_WHERE_INDEX="0")
  assert r.returncode != 0 and "memory coalescing should be on INDEX" in r.stderr, r.stderr[-2000:]
