#!/usr/bin/env python3
"""Where a start-up's seconds go once every kernel is cached: the engine's load, then each generation of the
server's warm-up (orin_llm.warmup.warm_up: greedy and sampled, prefill + decode), timed one by one. Run it
twice on one cache directory; the second run's figures are those of a start with every kernel cached. It writes no
steps file (step_cache.py): without one in the directory it measures their capture, which that file saves; with one
(from prewarm or a server) it measures a prewarmed start. The first generation of a
variant is the one that schedules and captures its steps (host work, whatever the device).
  warmup_time.py MODEL --cache DIR [--context 704] [--tiny16 VOCAB.gguf]
--tiny16 makes MODEL first if it is missing: tiny-llama with 16 layers (the 1B's kernel count per step at a
size the CPU backend runs in seconds), from VOCAB's tokenizer."""
import argparse, os, time
from orin_llm import synth
from orin_llm.sampling import Sampling

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--cache", required=True)
ap.add_argument("--context", type=int, default=704); ap.add_argument("--tiny16")
a = ap.parse_args()
if a.tiny16 and not os.path.exists(a.model):
  synth.write_model(a.model, synth.preset("tiny-llama", n_layers=16), synth.QT.Q6_K, a.tiny16, vocab_size=4096)
from orin_llm.engine import Engine
from orin_llm import kernel_cache
from orin_llm.warmup import warm_up_prompt
t0 = time.monotonic()
eng = Engine(a.model, max_context=a.context, kernel_db=kernel_cache.prepare(a.model, a.cache))
print(f"load {time.monotonic() - t0:.1f} s", flush=True)
prompt = warm_up_prompt(eng)  # the server's warm-up prompt
for s in (Sampling(), Sampling(1.0, 40, 0.9, 0)):
  for i in range(3):
    t = time.monotonic()
    eng.reset()
    for _ in eng.generate(prompt, 4, s): pass
    print(f"{'greedy' if s.greedy else 'sampled'} generation {i + 1}: {time.monotonic() - t:.2f} s", flush=True)
c = kernel_cache.COUNTER
print(f"kernels: {c.hits} from the cache, {c.compiled} compiled, {c.searched} BEAM-searched")
