#!/usr/bin/env python3
"""The fast path against a plain one on the same device and file: logits of the step kernels as
compiled (BEAM-tuned, dequantization fused into each matvec) against a plain path whose weights
are dequantized once into float32 matrices and multiplied by tinygrad's default kernels (BEAM=0);
then the compiled prefill's last logits (chunks of up to 512 rows: tensor-core products) and greedy tokens of the
compiled loop against the plain path's.
  check_fast_path.py MODEL [--positions N] [--tokens N] [--context N] [--prompt N]
--context: the bench's (4352) to run the kernels its search found; --prompt: > 512 to run full matrix chunks at depth."""
import argparse
import numpy as np
from tinygrad.helpers import Context
from orin_llm.engine import Engine
from orin_llm.quant import QuantWeight
from orin_llm.sampling import Sampling

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--positions", type=int, default=6)
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--context", type=int, default=704); ap.add_argument("--prompt", type=int, default=40)
a = ap.parse_args()
rng = np.random.default_rng(1)
eng = Engine(a.model, max_context=a.context)  # the bench's context: same kernels, so BEAM results are reused
prompt = rng.integers(0, eng.cfg.vocab_size, a.prompt).tolist()
eng.prefill(0, prompt)
fast_prefill = eng.state.logits[0].numpy()  # the compiled chunks' logits of the prompt's last row
eng.reset()
fast_tokens = list(eng.generate(prompt, a.tokens, Sampling()))  # compiled prefill + decode steps
fast_logits = []
eng.reset()
with Context(BEAM=0): eng.forward(prompt[:30], 0)
for p in range(30, 30 + a.positions):  # the compiled decode step, run at several positions
  eng.slots[0].next = prompt[p]
  eng.decode([0], 1)
  fast_logits.append(eng.state.logits[0].numpy())
dense = {}
def plain_call(self, x):  # float32 weights, dequantized once
  if id(self) not in dense: dense[id(self)] = self.weights().contiguous().realize()
  return x @ dense[id(self)].T
QuantWeight.__call__ = plain_call
eng.reset()
with Context(BEAM=0):
  eng.forward(prompt[:30], 0)
  errs = [float(np.linalg.norm(f - (r := eng.forward([prompt[p]], p))) / np.linalg.norm(r)) for p, f in zip(range(30, 30 + a.positions), fast_logits)]
  eng.reset()
  plain_tokens, logits = [], eng.forward(prompt, 0)
  perr = float(np.linalg.norm(fast_prefill - logits) / np.linalg.norm(logits))
  for i in range(a.tokens):
    plain_tokens.append(int(np.argmax(logits)))
    logits = eng.forward([plain_tokens[-1]], len(prompt) + i)
print("logits rel err at positions 30..:", " ".join(f"{e:.2e}" for e in errs), "max", f"{max(errs):.2e}", "PASS" if max(errs) < 1e-2 else "FAIL")
print(f"prefill of {len(prompt)} tokens, last row's logits rel err {perr:.2e}", "PASS" if perr < 1e-2 else "FAIL")
same = sum(x == y for x, y in zip(fast_tokens, plain_tokens))
print(f"greedy tokens: {same}/{a.tokens} equal", "PASS" if same == a.tokens else "FAIL", fast_tokens[:12], plain_tokens[:12])
