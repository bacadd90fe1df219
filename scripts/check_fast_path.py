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
# the host's copies into the run state at an offset (hostio: asynchronous on CUDA), read back through a tinygrad kernel
probe = rng.integers(0, 1 << 30, 77).astype(np.int32)
eng._copy_in(eng.state.prompt, 600, probe)
back = eng.state.prompt[600:677].numpy()
print("host copy at an offset, read back:", "PASS" if (back == probe).all() else f"FAIL ({int((back != probe).sum())} of 77 differ)")
chosen = eng.prefill(0, prompt)
fast_prefill = eng.state.logits[0].numpy()  # the compiled chunks' logits of the prompt's last row
print("the device's greedy choice against numpy's argmax of its logits:", "PASS" if chosen == int(np.argmax(fast_prefill)) else f"FAIL ({chosen} against {int(np.argmax(fast_prefill))})")
eng.reset()
chunk_ends, chunk_logits = [], []  # again, each chunk's last row read after it (the host waits): where the paths part
for done in eng.prefill_chunks(0, prompt):
  chunk_ends.append(done); chunk_logits.append(eng.state.logits[0].numpy())
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
  for end, f in zip(chunk_ends[:-1], chunk_logits):  # the chunks before the last: the plain path's row end-1
    eng.reset()
    r = eng.forward(prompt[:end], 0)
    print(f"  prefill chunk ending at {end}: last row's logits rel err {float(np.linalg.norm(f - r) / np.linalg.norm(r)):.2e}")
  eng.reset()
  plain_tokens, logits = [], eng.forward(prompt, 0)
  perr = float(np.linalg.norm(fast_prefill - logits) / np.linalg.norm(logits))
  print(f"  the same prefill, read after each chunk: last row's logits rel err {float(np.linalg.norm(chunk_logits[-1] - logits) / np.linalg.norm(logits)):.2e}")
  for i in range(a.tokens):
    plain_tokens.append(int(np.argmax(logits)))
    logits = eng.forward([plain_tokens[-1]], len(prompt) + i)
print("logits rel err at positions 30..:", " ".join(f"{e:.2e}" for e in errs), "max", f"{max(errs):.2e}", "PASS" if max(errs) < 1e-2 else "FAIL")
print(f"prefill of {len(prompt)} tokens, last row's logits rel err {perr:.2e}", "PASS" if perr < 1e-2 else "FAIL")
same = sum(x == y for x, y in zip(fast_tokens, plain_tokens))
print(f"greedy tokens: {same}/{a.tokens} equal", "PASS" if same == a.tokens else "FAIL", fast_tokens[:12], plain_tokens[:12])
