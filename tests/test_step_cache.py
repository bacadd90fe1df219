"""Captured steps kept across starts (orin_llm/step_cache.py): a fresh process that loads them runs the same
steps on its own freshly loaded weights, checked against the float64 reference, and a file that cannot be
used is ignored."""
import json, os, pathlib, subprocess, sys
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm import step_cache, kernel_cache
from orin_llm.engine import Engine
from orin_llm.synth import write_model, preset
from reference import Reference, assert_greedy_matches
from conftest import LLAMA_VOCAB, seed_for

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB, CONTEXT, CHUNK = 2048, 96, 16

# run in a fresh process: prompt in, the greedy tokens, the logits after the last one and where the steps came from
RUN = """
import json, sys
from orin_llm.engine import Engine
from orin_llm import log, kernel_cache
log.setup()
a = json.loads(sys.argv[1])
eng = Engine(a["model"], max_context=a["context"], chunk=a["chunk"], kernel_db=kernel_cache.prepare(a["model"], a["cache"]))
toks = list(eng.generate(a["prompt"], a["n"]))
print(json.dumps({"tokens": toks, "logits": eng.state.logits[0].numpy().tolist(), "steps": str(eng.steps_file)}))
"""

def run(model, cache, prompt, n, context=CONTEXT, **env):
  arg = json.dumps({"model": str(model), "cache": str(cache), "context": context, "chunk": CHUNK, "prompt": prompt, "n": n})
  r = subprocess.run([sys.executable, "-c", RUN, arg], capture_output=True, text=True, timeout=900,
                     env={**os.environ, "DEV": "CPU", "BEAM": "0", "PYTHONPATH": str(ROOT), **env})
  assert r.returncode == 0, r.stderr
  return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr

@pytest.fixture(scope="module")
def model(tmp_path_factory):
  return write_model(tmp_path_factory.mktemp("m") / "m.gguf", preset("tiny-llama"), QT.Q6_K, LLAMA_VOCAB, seed=seed_for("model m"),
                     vocab_size=VOCAB)

def check_against_reference(model, prompt, out):
  """The greedy tokens and the logits after them, against the float64 reference."""
  ref = Reference(model)
  logits = assert_greedy_matches(ref, ref.run(prompt), out["tokens"])
  got = np.array(out["logits"])
  assert np.linalg.norm(got - logits) / np.linalg.norm(logits) < 1e-2

def test_loaded_steps_match_reference(model, tmp_path, rng):
  from orin_llm.warmup import warm_up
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  assert eng.steps_file is None  # nothing kept yet
  warm_up(eng)  # captures every step, then keeps them
  path = step_cache.path_for(eng)
  assert eng.steps_file == path and path.exists()
  # a prompt over three chunks, the last one partial, then decode: the loading process captures nothing,
  # and its steps read the weights it loaded itself (none are in the file)
  prompt = rng.integers(0, VOCAB, 2 * CHUNK + 5).tolist()
  out, log = run(model, tmp_path, prompt, 7)
  assert out["steps"] == str(path) and "loaded from" in log and "compiling the" not in log, log
  check_against_reference(model, prompt, out)
  # JIT=0 runs every step uncompiled, which loaded steps cannot: the file is left alone
  out, log = run(model, tmp_path, prompt, 3, JIT="0")
  assert out["steps"] == "None" and "JIT=0" in log, log
  check_against_reference(model, prompt, out)
  # graph and programs, not the weights: no plane's bytes are in the file
  data = path.read_bytes()
  for name in ("token_embd.weight", "blk.1.ffn_down.weight"):
    for p in eng.weights[name].planes.values(): assert p.numpy().tobytes()[:512] not in data, name

def test_another_context_loads_the_steps(model, tmp_path, rng):
  """Issue 25: a change of context_length captures nothing. Steps captured at one context (variables reaching twice
  it) run at a larger one whose KV cache has twice the rows, on positions past the first one's cache, against the
  float64 reference; a context past their reach, or one that would hold their larger scratch for nothing, does not
  take them."""
  from orin_llm.warmup import warm_up
  first, later = 960, 1500  # KV-cache capacities 1024 and 2048 at a server's start (model.kv_capacity: blocks of 1024)
  eng = Engine(model, max_context=first, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path), reach=True)  # a prewarm's
  warm_up(eng)
  path = eng.steps_file
  assert path == step_cache.path_for(eng) and path.exists() and eng.reach == 2 * first
  prompt = rng.integers(0, VOCAB, 1100 + int(rng.integers(0, 40))).tolist()  # past the first engine's 1024 rows
  out, log = run(model, tmp_path, prompt, 5, context=later)
  assert out["steps"] == str(path) and "loaded from" in log and "compiling the" not in log, log
  check_against_reference(model, prompt, out)
  # at the prewarm's own context too, and at the reach; not past it, nor where the file's scratch would be twice a prewarm's
  out, log = run(model, tmp_path, prompt[:500], 3, context=first)
  assert out["steps"] == str(path) and "compiling the" not in log, log
  check_against_reference(model, prompt[:500], out)
  found = lambda context: step_cache.find(Engine(model, max_context=context, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path)))
  assert found(2 * first) == path
  assert found(2 * first + 1) is None
  assert found(first - 1) is None

def test_steps_file_keyed_by_reach_and_chunk(model, tmp_path):
  a = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  b = Engine(model, max_context=CONTEXT + 32, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  c = Engine(model, max_context=CONTEXT, chunk=CHUNK // 2, kernel_db=kernel_cache.prepare(model, tmp_path))
  assert len({step_cache.path_for(e) for e in (a, b, c)}) == 3
  assert step_cache.path_for(Engine(model, max_context=CONTEXT, chunk=CHUNK)) is None  # no cache directory: none kept

def test_steps_file_keyed_by_the_matvec_settings(model, tmp_path, monkeypatch):
  """MV_* change the hand-coded opts (tinygrad patches 0003, 0013, 0017), which the kernel database does not key: a
  steps file captured under other values would run the other kernels."""
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  before = step_cache.path_for(eng)
  monkeypatch.setenv("MV_LANE_UNROLL", "4")
  assert step_cache.path_for(eng) != before
  monkeypatch.delenv("MV_LANE_UNROLL")
  assert step_cache.path_for(eng) == before
  monkeypatch.setenv("FEW_ROW_SQUARES", "0")  # a few rows' sums of squares (patch 0049) in the matvec rules' layout
  assert step_cache.path_for(eng) != before
  monkeypatch.delenv("FEW_ROW_SQUARES")
  assert step_cache.path_for(eng) == before

def test_steps_file_keyed_by_the_affine_form_in_effect(model, tmp_path, monkeypatch):
  """quant.AFFINE (types) and AFFINE_ROWS change the programs: keyed as in effect, so the types' order does not matter and
  the rows do not matter while no type takes the form."""
  from orin_llm import quant
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  keys = {}
  for types, rows in (((QT.Q6_K, QT.Q4_K), 1), ((QT.Q4_K, QT.Q6_K), 1), ((QT.Q4_K, QT.Q6_K), 4), ((), 1), ((), 4)):
    monkeypatch.setattr(quant, "AFFINE", types); monkeypatch.setattr(quant, "AFFINE_ROWS", rows)
    keys[types, rows] = step_cache.path_for(eng)
  assert keys[(QT.Q6_K, QT.Q4_K), 1] == keys[(QT.Q4_K, QT.Q6_K), 1] != keys[(QT.Q4_K, QT.Q6_K), 4]
  assert keys[(), 1] == keys[(), 4] not in (keys[(QT.Q4_K, QT.Q6_K), 1], keys[(QT.Q4_K, QT.Q6_K), 4])

def test_steps_file_keyed_by_the_search_bounds(model, tmp_path, monkeypatch):
  """[beam] time_limit and min_us ($BEAM_TIME_LIMIT, $BEAM_MIN_US): steps captured after a shorter search are not what a
  server configured for the default search loads (it captures its own, searching what the shorter one left out). Unset
  is the default (settings.SEARCH_DEFAULTS), and one number written two ways is one bound."""
  from orin_llm.settings import SEARCH_DEFAULTS
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  for k in ("BEAM_TIME_LIMIT", "BEAM_MIN_US"): monkeypatch.delenv(k, raising=False)
  unset = step_cache.path_for(eng)
  monkeypatch.setenv("BEAM_MIN_US", SEARCH_DEFAULTS["BEAM_MIN_US"] + ".0")
  assert step_cache.path_for(eng) == unset
  monkeypatch.setenv("BEAM_TIME_LIMIT", "5")
  quick = step_cache.path_for(eng)
  assert quick != unset
  monkeypatch.setenv("BEAM_TIME_LIMIT", "5e0")
  assert step_cache.path_for(eng) == quick
  monkeypatch.setenv("BEAM_MIN_US", "1000")
  assert step_cache.path_for(eng) not in (quick, unset)

def test_unusable_file_is_ignored(model, tmp_path, rng):
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  step_cache.path_for(eng).write_bytes(b"not a pickle")
  prompt = rng.integers(0, VOCAB, CHUNK + 3).tolist()
  out, log = run(model, tmp_path, prompt, 4)
  assert out["steps"] == "None" and "cannot use" in log and "compiling the" in log
  check_against_reference(model, prompt, out)

def test_refuses_steps_that_read_unnamed_buffers(model, tmp_path, monkeypatch):
  """A buffer the steps read but never write would be lost in the file: saving refuses rather than keep
  a step that would run on garbage."""
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  list(eng.generate(list(range(1, CHUNK + 3)), 3))
  full = step_cache.state_tensors(eng)
  lost = full["weights.blk.0.attn_norm.weight"].uop.base  # under every name it has
  monkeypatch.setattr(step_cache, "state_tensors", lambda e: {k: v for k, v in full.items() if v.uop.base is not lost})
  with pytest.raises(ValueError, match="neither engine state nor written"):
    step_cache.save(eng, tmp_path / "x.pkl")
  assert step_cache.try_save(eng) is None and not step_cache.path_for(eng).exists()

def test_loaded_steps_that_fail_are_captured_anew(model, tmp_path):
  """A loaded step that raises when the warm-up runs it (a file that unpickles but does not fit this process) is
  dropped: the warm-up captures the steps anew and rewrites the file."""
  from orin_llm.warmup import warm_up
  warm_up(Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path)))
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  path = eng.steps_file
  assert eng.steps_loaded and path.exists()
  class Broken:
    def __call__(self, *a, **k): raise RuntimeError("does not run here")
    captured = None
  eng.steps.jits["chunk1"] = Broken()
  warm_up(eng)
  assert not eng.steps_loaded and eng.steps_file == path and path.exists()  # rewritten from the new capture
  assert len(eng.steps.jits) == 7 and all(not isinstance(j, Broken) and j.captured is not None for j in eng.steps.jits.values())  # with the masked choices and the short decode step

def test_steps_file_keyed_by_the_searched_steps(model, tmp_path, monkeypatch):
  """ORIN_LLM_BEAM_STEPS=prefill compiles decode with the hand-coded opts under BEAM > 0: other programs."""
  from orin_llm import settings
  eng = Engine(model, max_context=CONTEXT, chunk=CHUNK, kernel_db=kernel_cache.prepare(model, tmp_path))
  monkeypatch.setattr(settings, "BEAM_STEPS", "all")
  before = step_cache.path_for(eng)
  monkeypatch.setattr(settings, "BEAM_STEPS", "prefill")
  assert step_cache.path_for(eng) != before
  monkeypatch.setattr(settings, "BEAM_STEPS", "all")
  assert step_cache.path_for(eng) == before
