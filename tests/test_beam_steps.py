"""ORIN_LLM_BEAM_STEPS (settings.BEAM_STEPS, engine.searched): with "prefill", a BEAM search (BEAM > 0) takes the prefill
chunks' kernels and not the decode step's; with "all" (the default) it takes both; anything else is refused. tinygrad's
beam_search is replaced by a recorder in a fresh process on the CPU (no search is run: it returns the kernel as given)."""
import json, os, pathlib, subprocess, sys
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.errors import OrinError
from orin_llm.settings import beam_steps
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB, seed_for

ROOT = pathlib.Path(__file__).resolve().parents[1]

RUN = """
import json, sys
import tinygrad.codegen.opt.search as search
calls = []
def recorder(k, rawbufs, var_vals, amt, *args, **kwargs):
  calls.append(amt)
  return k
search.beam_search = recorder
from orin_llm.engine import Engine
eng = Engine(sys.argv[1], max_context=64, chunk=16)
loaded = len(calls)  # the load's own kernels (tables, the weights' planes): not a step's
eng.steps.chunk(1)(eng.v_pos.bind(0), eng.v_slot.bind(0), eng.v_len.bind(1))  # the decode step, captured
decode = len(calls) - loaded
eng.steps.chunk(16)(eng.v_pos.bind(0), eng.v_slot.bind(0), eng.v_len.bind(16))  # a prefill chunk of 16
print(json.dumps({"decode": decode, "prefill": len(calls) - loaded - decode}))
"""

@pytest.fixture(scope="module")
def model(tmp_path_factory):
  return write_model(tmp_path_factory.mktemp("m") / "m.gguf", preset("tiny-llama"), QT.Q6_K, LLAMA_VOCAB,
                     seed=seed_for("beam steps"), vocab_size=2048)

def searches(model, steps: str) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith(("BEAM", "JITBEAM", "ORIN_LLM_BEAM"))}
  env |= {"DEV": "CPU", "BEAM": "1", "BEAM_MIN_US": "0", "PARALLEL": "0", "PYTHONPATH": str(ROOT), "ORIN_LLM_BEAM_STEPS": steps}
  r = subprocess.run([sys.executable, "-c", RUN, str(model)], capture_output=True, text=True, timeout=900, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_prefill_only(model):
  n = searches(model, "prefill")
  assert n["decode"] == 0  # decode compiled with the hand-coded opts
  assert n["prefill"] > 0  # the chunk of 16 searched

def test_all_steps(model):
  n = searches(model, "all")
  assert n["decode"] > 0 and n["prefill"] > 0

def test_refused():
  assert beam_steps({}) == "all" and beam_steps({"ORIN_LLM_BEAM_STEPS": " Prefill "}) == "prefill"
  with pytest.raises(OrinError, match="ORIN_LLM_BEAM_STEPS='decode'"): beam_steps({"ORIN_LLM_BEAM_STEPS": "decode"})
  # tinygrad's JITBEAM sets every captured step's search, over the Context the unsearched steps are called in
  with pytest.raises(OrinError, match="JITBEAM"): beam_steps({"ORIN_LLM_BEAM_STEPS": "prefill", "JITBEAM": "2"})
  assert beam_steps({"JITBEAM": "2"}) == "all"

def test_every_step_name(monkeypatch):
  """engine.Steps' names: prefill chunks (more than one token) and group steps searched under "prefill", the rest not."""
  from orin_llm import engine, settings
  names = {"chunk512": True, "chunk16": True, "group4x32": True, "chunk1": False, "batch4": False, "chunk1-short": False, "batch4-short": False, "verify8": False,
           "choose-one-greedy": False, "choose-batch4-sampled-masked": False, "choose-verify8-greedy": False}
  monkeypatch.setattr(settings, "BEAM_STEPS", "prefill")
  assert {n: engine.searched(n) for n in names} == names
  monkeypatch.setattr(settings, "BEAM_STEPS", "all")
  assert all(engine.searched(n) for n in names)
