#!/usr/bin/env python3
"""The batched paths against each sequence alone, on the device and kernels as compiled (BEAM results included): four
prompts prefilled together (Steps.group: a step over every slot, matrix form on tensor cores), then decode steps of
the batch (Steps.batch), against each prompt prefilled and decoded alone in slot 0 (Steps.chunk). Prints each slot's
first-token logits' relative error, its greedy tokens, and PASS/FAIL. check_fast_path.py covers one sequence.
  check_batch.py MODEL [--context N] [--max-batch B] [--tokens N] [--prompt N]
--context: the bench's or the server's (4352, 4096) to run the kernels a prewarm searched."""
import argparse
import numpy as np
from orin_llm.engine import Engine
from orin_llm.sampling import Sampling

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--context", type=int, default=4352)
ap.add_argument("--max-batch", type=int, default=4); ap.add_argument("--tokens", type=int, default=16)
ap.add_argument("--prompt", type=int, default=16, help="the shortest prompt's tokens (the load bench's: 16)")
ap.add_argument("--seed", type=int, default=None, help="the prompts' random seed (default: fresh, printed)")
a = ap.parse_args()
seed = a.seed if a.seed is not None else int(np.random.SeedSequence().entropy % (1 << 31))
print(f"seed {seed}")
rng = np.random.default_rng(seed)
eng = Engine(a.model, max_context=a.context, max_batch=a.max_batch)
from orin_llm.engine import HIST
assert 1 <= a.tokens <= HIST, f"--tokens: 1 to {HIST} (one decode round)"
G, V = eng.group_rows, eng.cfg.vocab_size
# short prompts take the group step; one longer than a group takes it twice (a joiner's second group)
lens = [a.prompt + int(rng.integers(0, 4)) for _ in range(a.max_batch - 1)] + [G + a.prompt]
prompts = [rng.integers(0, V, n).tolist() for n in lens]
alone = []
for p in prompts:
  eng.reset()
  first = eng.prefill(0, p)
  logits = eng.state.logits[0].numpy()
  steps = [eng.decode([0], 1) for _ in range(a.tokens)]  # one step at a time: each step's logits
  alone.append((first, logits, [int(s[0, 0]) for s in steps], eng.state.logits[0].numpy()))  # and the last step's logits
eng.reset()
jobs, first, logits, groups = {b: (p, Sampling()) for b, p in enumerate(prompts)}, {}, {}, 0
while jobs:
  got = eng.prefill_together(jobs)
  groups += 1
  for b in [b for b in jobs if got[b] == len(jobs[b][0])]:
    first[b], logits[b] = eng.first_token(b), eng.state.logits[b].numpy()
    del jobs[b]
batch = eng.decode(list(range(a.max_batch)), a.tokens)
last = eng.state.logits[:a.max_batch].numpy()
ok = True
print(f"{a.max_batch} prompts of {lens} tokens prefilled together in {groups} group steps of {G} rows, then {a.tokens} batched decode steps")
rel = lambda x, ref: float(np.linalg.norm(x - ref) / np.linalg.norm(ref))
for b, (f, lg, toks, lg_last) in enumerate(alone):
  err, err_last = rel(logits[b], lg), rel(last[b], lg_last)
  same = sum(x == y for x, y in zip(batch[:, b].tolist(), toks))
  good = err < 1e-2 and err_last < 1e-2 and first[b] == f and same == a.tokens
  ok &= good
  print(f"  slot {b}: logits rel err after the prompt {err:.2e}, after the last decode step {err_last:.2e}; first token {first[b]} / alone {f}, greedy {same}/{a.tokens} equal"
        f" {'PASS' if good else 'FAIL'} {batch[:6, b].tolist()} {toks[:6]}")
print("batched paths:", "PASS" if ok else "FAIL")
