#!/usr/bin/env python3
"""Start-up lead (issue: prewarmed kernel cache): keep the captured steps across starts. `save` loads the model,
generates (capturing the prefill, decode and greedy-choice steps), and pickles the engine's TinyJits with the
buffers they hold (weights, KV cache, scratch) and the token buffers; `load`, in a fresh process, unpickles them
and generates the same continuation without building, scheduling or capturing anything.
  jit_pickle_experiment.py save MODEL FILE.pkl
  jit_pickle_experiment.py load FILE.pkl"""
import pickle, sys, time
t0 = time.time()
PROMPT_LEN, CONTEXT = 600, 1024

def prompt(vocab): return [(7 + 31 * i) % vocab for i in range(PROMPT_LEN)]

if sys.argv[1] == "save":
  from orin_llm.engine import Engine
  eng = Engine(sys.argv[2], max_context=CONTEXT)
  t = time.time(); out = list(eng.generate(prompt(eng.cfg.vocab_size), 8)); print("first generate", round(time.time() - t, 2), out, flush=True)
  state = (dict(eng._jits), eng.tok_buf, eng.prompt_buf, eng.v_pos, eng.v_len, eng.v_next, eng.chunk, eng.cfg.vocab_size)
  t = time.time()
  with open(sys.argv[3], "wb") as f: pickle.dump(state, f, protocol=5)
  print("pickled in", round(time.time() - t, 2), "s", flush=True)
else:
  from tinygrad import Tensor, dtypes
  with open(sys.argv[2], "rb") as f: jits, tok_buf, prompt_buf, v_pos, v_len, v_next, chunk, vocab = pickle.load(f)
  print("unpickled in", round(time.time() - t0, 2), "s from start:", list(jits), flush=True)
  t, p = time.time(), prompt(vocab)
  prompt_buf[0:len(p)].assign(Tensor(p, dtype=dtypes.int32, device=prompt_buf.device)).realize()
  for s in range(0, len(p), chunk): jits[("prefill", None)](v_pos.bind(s), v_len.bind(min(chunk, len(p) - s)))
  jits[("choose", True)](v_next.bind(len(p)))
  out = [int(tok_buf[len(p)].item())]
  for i in range(7):
    jits[("decode", None)](v_pos.bind(len(p) + i)); jits[("choose", True)](v_next.bind(len(p) + i + 1))
    out.append(int(tok_buf[len(p) + i + 1].item()))
  print("generated in", round(time.time() - t, 2), out, "; from start", round(time.time() - t0, 2), "s", flush=True)
