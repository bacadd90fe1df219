"""Kernel cache selection, shipped databases, prewarm -> no compiles, the packed-planes cache."""
import json, os, pathlib, re, subprocess, sys
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
from orin_llm import kernel_cache
from orin_llm.loader import PlanesCache, load_weights, open_model
from orin_llm.quant import repack
from orin_llm.synth import write_model, preset

ROOT = pathlib.Path(__file__).resolve().parents[1]
from conftest import LLAMA_VOCAB as VOCAB

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", preset("tiny-llama"), QT.Q4_K, VOCAB, seed=0, vocab_size=2048)

def _name(path, arch="sm_87", beam=0):
  f, cfg = open_model(path)
  return kernel_cache.db_name("cuda", arch, kernel_cache.tinygrad_build(), kernel_cache.model_shape(cfg, f.tensors), beam)

def test_file_name_per_arch_model_beam(tiny, tmp_path):
  other = write_model(tmp_path / "other.gguf", preset("tiny-llama", n_layers=3), QT.Q4_K, VOCAB, seed=0, vocab_size=2048)
  same = write_model(tmp_path / "same.gguf", preset("tiny-llama"), QT.Q4_K, VOCAB, seed=1, vocab_size=2048)  # other weights
  q6 = write_model(tmp_path / "q6.gguf", preset("tiny-llama"), QT.Q6_K, VOCAB, seed=0, vocab_size=2048)
  base = _name(tiny)
  assert base == _name(tiny) == _name(same)
  assert base.startswith("kernels-cuda-sm_87-tinygrad") and base.endswith("-beam0.db")
  assert len({base, _name(tiny, arch="sm_90"), _name(tiny, beam=2), _name(other), _name(q6)}) == 5

def test_select_uses_the_file(tiny, tmp_path):
  from tinygrad import helpers, Tensor
  f, cfg = open_model(tiny)
  p = kernel_cache.select(tmp_path / "kc", "CPU", cfg, f.tensors, beam=0)
  assert p.parent == tmp_path / "kc" and p.name.startswith("kernels-cpu-") and helpers.CACHEDB == str(p) == os.environ["CACHEDB"]
  assert (Tensor.arange(7) * 3 + 1).tolist() == [1, 4, 7, 10, 13, 16, 19]
  assert p.exists() and kernel_cache.COUNTER.path == str(p), helpers.CACHEDB

def test_shipped_read_only_is_copied_and_written(tiny, tmp_path):
  """A read-only shipped database (the Nix store) is copied into the writable directory; tinygrad
  writes to the copy (WAL needs that), the original stays untouched."""
  f, cfg = open_model(tiny)
  name = kernel_cache.db_name(*kernel_cache.device_arch("CPU"), kernel_cache.tinygrad_build(), kernel_cache.model_shape(cfg, f.tensors), 0)
  ship = tmp_path / "ship"; ship.mkdir()
  import sqlite3
  con = sqlite3.connect(ship / name); con.execute("CREATE TABLE marker (x)"); con.execute("INSERT INTO marker VALUES (42)"); con.commit(); con.close()
  os.chmod(ship / name, 0o444); os.chmod(ship, 0o555)
  try:
    code = f"""
import os, sqlite3
from tinygrad import Tensor
from orin_llm import kernel_cache
from orin_llm.loader import open_model
f, cfg = open_model({str(tiny)!r})
p = kernel_cache.select({str(tmp_path / 'kc')!r}, "CPU", cfg, f.tensors, beam=0, shipped={str(ship)!r})
assert (Tensor.arange(9) * 5 + 2).tolist()[-1] == 42
con = sqlite3.connect(p)
print(con.execute("SELECT x FROM marker").fetchone()[0], len([r for r in con.execute("SELECT name FROM sqlite_master WHERE name LIKE 'compile%'")]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "DEV": "CPU"}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42", "1"]  # the shipped rows, and a compile table tinygrad added to the copy
    assert os.access(tmp_path / "kc" / name, os.W_OK) and not (ship / (name + "-wal")).exists()
  finally: os.chmod(ship, 0o755)

def _prewarm(tiny, cache, *extra):
  env = {**os.environ, "DEV": "CPU", "BEAM": "0", "PYTHONPATH": str(ROOT)}
  return subprocess.run([sys.executable, "-m", "orin_llm", "prewarm", "--model", str(tiny), "--cache", str(cache), "--context", "128", *extra],
                        capture_output=True, text=True, env=env, timeout=900)

def test_prewarm_then_server_start_compiles_nothing(tiny, tmp_path):
  out = _prewarm(tiny, tmp_path)
  assert out.returncode == 0, out.stderr
  db = pathlib.Path(out.stdout.strip().splitlines()[-1])
  assert db.parent == tmp_path and db.exists() and " compiled" in out.stderr
  # a fresh process: what the server does before READY (load, warm_up), then its counts; at another context than the
  # prewarm's, within its reach (issue 25: a change of context_length schedules and compiles nothing)
  code = f"""
import json
from orin_llm.appliance import load
from orin_llm.server.config import ServerConfig
from orin_llm.warmup import warm_up
from orin_llm.kernel_cache import COUNTER
eng, _ = load(ServerConfig(model={str(tiny)!r}, context_length=200, kernel_cache_directory={str(tmp_path)!r}))
warm_up(eng)
print(json.dumps(COUNTER.snapshot() | {{"steps": str(eng.steps_file)}}))
"""
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "DEV": "CPU", "BEAM": "0"}, timeout=900)
  assert r.returncode == 0, r.stderr
  c = json.loads(r.stdout.strip().splitlines()[-1])
  # the steps prewarm captured are loaded (step_cache.py); the few kernels outside them come from the database
  assert c["path"] == str(db) and c["misses"] == 0 and c["hits"] > 0 and c["steps"].startswith(str(tmp_path / "steps-")), c
  assert c["steps"].endswith("-reach256.pkl"), c  # the prewarm's steps, valid to twice its context

def test_prewarm_from_the_server_config(tiny, tmp_path):
  """`prewarm --config` (the NixOS prewarm unit) fills what a server of that config loads: its context's steps."""
  cache = tmp_path / "kc"
  conf = tmp_path / "orin-llm.toml"
  conf.write_text(f'model = "{tiny}"\ncontext_length = 80\n[beam]\nwidth = 0\n[kernel_cache]\ndirectory = "{cache}"\n')
  env = {**os.environ, "DEV": "CPU", "PYTHONPATH": str(ROOT)}
  env.pop("BEAM", None)
  out = subprocess.run([sys.executable, "-m", "orin_llm", "prewarm", "--config", str(conf)], capture_output=True, text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr
  assert pathlib.Path(out.stdout.strip().splitlines()[-1]).parent == cache and "-beam0.db" in out.stdout
  from orin_llm import step_cache
  from orin_llm.appliance import load
  from orin_llm.server.config import from_toml
  from dataclasses import replace
  eng, _ = load(from_toml(conf))  # what `serve --config` loads
  assert eng.steps_file == step_cache.find(eng) and eng.steps_file.exists()
  other, _ = load(replace(from_toml(conf), context_length=96))  # another context within the prewarm's reach (160): its steps
  assert other.steps_file == eng.steps_file

def test_repack_fast_path_matches_elementwise():
  """The byte-wise repack of Q4_K/Q5_K/Q6_K/Q8_0 equals the element-wise definition (random blocks)."""
  from orin_llm import quant
  rng = np.random.default_rng(0)
  for qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0):
    block, bsize = GGML_QUANT_SIZES[qt]
    rows, cols = 37, block * 3
    raw = rng.integers(0, 256, (rows, cols // block * bsize), dtype=np.uint8)
    fast = repack(raw, qt, rows, cols)
    b = raw.reshape(-1, bsize)
    if qt == QT.Q8_0: u = b[:, 2:34] ^ np.uint8(0x80)
    elif qt == QT.Q6_K:
      ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 1, 32)
      lo = np.concatenate([ql[:, :, :32] & 0xF, ql[:, :, 32:] & 0xF, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=-1)
      u = (lo | ((((qh >> (np.arange(4, dtype=np.uint8) * 2)[None, None, :, None]) & 3)).reshape(-1, 2, 128) << 4)).reshape(-1, 256)
    else:
      qs = (b[:, 48:176] if qt == QT.Q5_K else b[:, 16:144]).reshape(-1, 4, 32)
      u = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 256)
      if qt == QT.Q5_K: u = u | (((b[:, 16:48][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(-1, 256) << 4)
    want = {"q8": quant._pack(u, 8)} if qt == QT.Q8_0 else {"q4": quant._pack(u, 4)}
    # Q6_K's 2-bit plane: 16 codes to a little-endian word, each word two 16-bit units of 8 (quant.py: qh2)
    if qt == QT.Q6_K: want["qh2"] = quant._pack(u >> 4, 2).view(np.uint16)
    if qt == QT.Q5_K: want["qh1"] = quant._pack(u >> 4, 1)
    for k, v in want.items(): assert fast[k].dtype == v.dtype and np.array_equal(fast[k], v.reshape(rows, -1)), (qt.name, k)
    assert all(p.flags.c_contiguous and p.flags.writeable for p in fast.values())

def test_planes_cache_round_trip_and_invalidation(tmp_path):
  m = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q6_K, VOCAB, seed=0, vocab_size=2048)
  f, cfg = open_model(m)
  fresh = {n: repack(f.raw(n), t.qtype, *t.shape) for n, t in f.tensors.items() if len(t.shape) == 2}
  assert PlanesCache(tmp_path / "c", f).read() is None
  w1 = load_weights(f, cfg, "CPU", cache_dir=tmp_path / "c")  # writes
  got = PlanesCache(tmp_path / "c", f).read()
  assert got is not None and got.keys() == fresh.keys()
  for n in fresh:
    for k in fresh[n]: assert np.array_equal(got[n][k], fresh[n][k]) and got[n][k].dtype == fresh[n][k].dtype, (n, k)
  w2 = load_weights(f, cfg, "CPU", cache_dir=tmp_path / "c")  # reads
  for n in fresh:
    for k in fresh[n]: assert np.array_equal(w2[n].planes[k].numpy(), w1[n].planes[k].numpy())
  # the model file changes (other weights, same shapes): the old planes are stale and replaced
  write_model(m, preset("tiny-llama"), QT.Q6_K, VOCAB, seed=1, vocab_size=2048)
  f2, _ = open_model(m)
  assert PlanesCache(tmp_path / "c", f2).read() is None
  load_weights(f2, cfg, "CPU", cache_dir=tmp_path / "c")
  assert len(list((tmp_path / "c").glob("planes-*.json"))) == 1 and len(list((tmp_path / "c").glob("planes-*.bin"))) == 1
  got2 = PlanesCache(tmp_path / "c", f2).read()
  n = "blk.0.ffn_down.weight"
  assert np.array_equal(got2[n]["q4"], repack(f2.raw(n), f2.tensors[n].qtype, *f2.tensors[n].shape)["q4"])
  assert not np.array_equal(got2[n]["q4"], fresh[n]["q4"])

def test_requests_after_warm_up_compile_nothing(tiny, tmp_path, rng):
  """After the server's warm-up, prompts of lengths it never saw, prefix reuse and new sampling settings run
  only what was compiled: writing the prompt and the parameters is a copy, not a kernel per length and offset."""
  from orin_llm.engine import Engine
  from orin_llm.warmup import warm_up
  from orin_llm.sampling import Sampling
  from orin_llm import kernel_cache
  from orin_llm.kernel_cache import COUNTER
  from orin_llm.structured import AllowAll
  eng = Engine(tiny, max_context=128, chunk=16, kernel_db=kernel_cache.prepare(tiny, tmp_path))
  warm_up(eng)
  before = COUNTER.snapshot()
  prompt = rng.integers(0, 2048, 3).tolist()
  for n in rng.choice(np.arange(4, 60), 4, replace=False):
    prompt = prompt + rng.integers(0, 2048, int(n)).tolist()  # longer each time: the cached prefix is reused
    s = Sampling(float(rng.uniform(0.5, 1.5)), int(rng.integers(1, 50)), 0.9, int(rng.integers(0, 1 << 30)))
    toks = list(eng.generate(prompt[:100], 3, s))
    assert len(toks) == 3 and eng.state.prompt.numpy()[:len(prompt[:100])].tolist() == prompt[:100]
    # a constrained request (structured.py) runs the masked choices the warm-up compiled
    assert len(list(eng.generate(prompt[:100], 3, s if n % 2 else Sampling(), constraint=AllowAll(eng.cfg.vocab_size)))) == 3
  after = COUNTER.snapshot()
  assert after["misses"] == before["misses"] and after["hits"] == before["hits"], (before, after)

def test_decode_across_the_short_steps_bound_after_warm_up_compiles_nothing(tiny, tmp_path, rng):
  """The warm-up captures the decode and batch steps of both block sizes (model.SHORT_BLOCK below engine.short_keys,
  ROW_BLOCK above): a lone sequence and a batch of two whose decoding crosses the bound run only what it compiled."""
  from orin_llm.engine import Engine
  from orin_llm.warmup import warm_up
  from orin_llm import kernel_cache
  from orin_llm.kernel_cache import COUNTER
  eng = Engine(tiny, max_context=128, chunk=16, kernel_db=kernel_cache.prepare(tiny, tmp_path), max_batch=2)
  bound = int(rng.integers(24, 40))
  eng.short_keys = bound
  warm_up(eng)
  before = COUNTER.snapshot()
  prompts = [rng.integers(0, 2048, int(rng.integers(bound - 12, bound - 2))).tolist() for _ in range(2)]
  assert len(list(eng.generate(prompts[0], 16))) == 16  # alone: positions from under the bound to past it
  eng.reset()
  for s, p in enumerate(prompts): eng.prefill(s, p)
  for _ in range(4): eng.decode([0, 1], 4)  # together, across it
  assert min(len(eng.slots[s].cached) for s in range(2)) > bound
  after = COUNTER.snapshot()
  assert after["misses"] == before["misses"] and after["hits"] == before["hits"], (before, after)
  assert {"chunk1", "chunk1-short", "batch2", "batch2-short"} <= set(eng.steps.jits)

@pytest.mark.parametrize("to", ["process", "group"])
def test_prewarm_stopped_by_sigterm_ends_quietly(tiny, tmp_path, to):
  """SIGTERM in the middle of a BEAM search (`timeout`, `kill`, a stopped unit) ends the prewarm with 143, a line saying
  what is kept, its worker pool ended: no worker's BrokenPipeError traceback, no leaked-semaphore warning (issue 25).
  `timeout` and systemd signal the whole process group, workers included: sent so while the pool was idle (right after a
  batch of kernels), half the prewarms hung in Pool.terminate() on a lock a killed worker held (tinygrad patch 0018).
  The fork server is in the group too: killed while the pool replaced a dead worker, it refused the connection and that
  thread printed a ConnectionRefusedError traceback (CI, 1 run of many; tinygrad patch 0041 has it block SIGTERM)."""
  import random, signal, time
  env = {**os.environ, "DEV": "CPU", "BEAM": "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
  p = subprocess.Popen([sys.executable, "-m", "orin_llm", "prewarm", "--model", str(tiny), "--cache", str(tmp_path), "--context", "128"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
  lines = []
  try:
    for line in p.stdout:
      lines.append(line)
      if to == "process" and "compiling the" in line: break  # the steps' kernels are being searched now
      if to == "group" and re.search(r"kernels (\d+)/\1 ", line): break  # a batch just ended: the pool's workers are idle
    time.sleep(random.uniform(2, 6) if to == "process" else random.uniform(0, 0.3))
    if to == "process": p.send_signal(signal.SIGTERM)
    else: os.killpg(p.pid, signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
  finally:
    try: os.killpg(p.pid, signal.SIGKILL)  # whatever is left of a prewarm that did not end
    except ProcessLookupError: pass
  out = "".join(lines) + out
  assert p.returncode == 143, out[-3000:]
  assert "prewarm: stopped (SIGTERM)" in out and "Traceback" not in out and "leaked" not in out, out[-3000:]

def test_step_kernels_do_not_depend_on_the_context(tiny, monkeypatch):
  """Issue 25: a change of context_length must reuse the searched kernels. tinygrad keys a search by the kernel's AST
  without buffer sizes and variable bounds (patch 0009), so every kernel of the decode, verify and chunk steps (the
  CPU's size and a GPU's matrix form) must have the same key at two contexts: the context may enter a kernel only as a
  buffer's size or a variable's bound, never as a stride. The attention's scores were laid out with the block count
  inside (strides of the largest block count): 3 of the decode step's kernels had other keys at the other context,
  and 4 a layer of the matrix-form chunk's (its scores, their maxima, the probabilities and their product with V)."""
  import tinygrad.codegen as cg
  from tinygrad.codegen.opt.postrange import Scheduler
  from tinygrad.codegen.opt.search import _beam_key_ast
  from tinygrad.device import Device
  from tinygrad.uop.ops import Ops
  from orin_llm import quant
  from orin_llm.engine import Engine
  from orin_llm.model import Rows
  keys, apply_opts, current = {}, cg.apply_opts, None
  def record(ast, ren, beam=0):  # the key beam_search would look the kernel up by
    k = Scheduler(ast, ren)
    k.convert_loop_to_global()
    keys.setdefault(current, set()).add(_beam_key_ast(k.ast).key)
    return apply_opts(ast, ren, beam)
  cg.apply_opts = record
  MATRIX = 64  # a chunk of this many rows runs in the matrix form, as on a GPU (attend_chunk, float16 products)
  monkeypatch.setattr(quant, "MATMUL_ROWS", 32)
  sizes = (1, 4, 16, MATRIX)  # decode, a verify step, a CPU-sized chunk, a GPU's chunk
  try:
    for context in (256, 512):
      current = None  # the engine's load realizes kernels of its own
      eng = Engine(tiny, max_context=context, device="CPU", max_batch=2, chunk=MATRIX)
      st, pos, slot = eng.state, eng.v_pos.bind(100), eng.v_slot.bind(1)
      batch = Rows(tuple(v.bind(90 + 3 * b) for b, v in enumerate(eng.v_rows[:2])), 1, 0, eng.v_blocks.bind(1))
      for T in sizes + ("batch",):  # and a batched decode step of two sequences
        current = (context, T)
        if T == "batch": out = eng.model(st.next_tok[0:2], batch)
        else: out = eng.model(st.prompt[pos:pos + T] if T > 1 else st.next_tok[0:1], Rows((pos,), T, slot), all_rows=T == 4)
        for call in out.linear_with_vars()[0].src:
          if call.op is Ops.CALL and call.src[0].op is Ops.SINK: cg.full_rewrite_to_sink(call.src[0], Device["CPU"].renderer)
  finally: cg.apply_opts = apply_opts
  for T in sizes + ("batch",):
    assert keys[(256, T)] == keys[(512, T)], (T, len(keys[(256, T)] - keys[(512, T)]))

def test_pool_compiles_before_a_search_count_as_progress():
  """The server's watchdog (server/cli.py engine_alive) takes a compile or a search that progresses for no hang. With
  BEAM, lower_and_compile first compiles a batch's hand-coded opts in the worker pool (tinygrad patch 0035), the parent
  only waiting: each result it gets is progress (kernel_cache.Counter wraps worker.imap_unordered_watched)."""
  r = subprocess.run([sys.executable, "-c", """
import time
from orin_llm import kernel_cache
from tinygrad.engine import worker
kernel_cache.COUNTER.install()
kernel_cache.COUNTER.progress = 0.0
seen = []
for i, x in worker.imap_unordered_watched(lambda t: (t[0], t[0] * 2), [(0,), (1,), (2,)], None):
  seen.append((x, kernel_cache.COUNTER.progressed(60)))
print(sorted(seen))
"""], capture_output=True, text=True, timeout=300, env={**os.environ, "PARALLEL": "0", "DEV": "CPU"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip().splitlines()[-1] == "[(0, True), (2, True), (4, True)]", r.stdout
