"""The warm-up: the steps the server replays, run once so that they are compiled (kernel_cache.py) and
captured (step_cache.py) before the first request. One routine for the server's warm-up before READY=1
(server/worker.py) and `orin-llm prewarm` (prewarm.py), so whatever the server compiles is what prewarm
cached."""
from __future__ import annotations
import time
from orin_llm import log

def warm_up_prompt(eng) -> list[int]:
  """A prompt that runs every chunk size the engine has (engine.chunk_plan: the largest chunk, then small ones, two
  of them so that their variables move), within the context."""
  n = eng.chunk + (2 * eng.chunks[0] - 3 if len(eng.chunks) > 1 else eng.chunk // 2 + 1)
  n = max(1, min(n, eng.max_context - 8))
  return [(7 + 31 * i) % eng.cfg.vocab_size for i in range(n)]

def warm_up(eng, beat=lambda: None, progress: bool = False):
  """Captures the compiled steps the server replays: prefill in every chunk size and of the slots of each batch size at once, decoding
  alone and decoding in each batch size, greedy and sampled, and the masked choices of constrained requests (structured.py) alone and in
  each batch size, under a mask that allows everything. The engine's JITs capture on their first call, and each
  round calls each step more than once, so the first round captures and the second replays. beat() runs between
  rounds (the server's heartbeat). BEAM searches at the variables' midpoints, whatever the prompt."""
  from orin_llm.sampling import Sampling
  from orin_llm import kernel_cache
  from orin_llm import step_cache
  from orin_llm.structured import AllowAll
  prompt = warm_up_prompt(eng)
  allow = AllowAll(eng.cfg.vocab_size)
  rounds = [(s, i) for s in (Sampling(), Sampling(1.0, 40, 0.9, 0)) for i in range(2)]  # the second: replays only
  def one_round(s: Sampling):
    short = eng.short_keys
    eng.short_keys = 0  # the steps of long contexts first, whatever the positions (a short prompt on the CPU)
    try: long_round(s)
    finally: eng.short_keys = short
    if short:  # then those of short contexts (engine.short_keys): every slot's prompt a few tokens from position 0
      for B in (1,) + eng.batch_sizes:
        for slot in range(B): eng.reset(slot); eng.prefill(slot, prompt[slot:slot + 5], s)
        for _ in range(2): eng.decode(list(range(B)), 2)
      if getattr(eng, "speculator", None) is not None and hasattr(src := eng.speculator().source, "eng"):
        src.eng.reset(); src.propose(prompt[:3], 3); src.propose(prompt[:3], 3)
  def long_round(s: Sampling):
    eng.reset()  # from scratch each time: prefill runs all its chunks
    for _ in eng.generate(prompt, 4, s): pass
    for _ in eng.generate(prompt, 3, s, constraint=allow): pass  # the cached prompt: its last token, then masked decode
    if getattr(eng, "speculator", None) is not None:  # verify steps of every size, and the draft model's own steps
      from orin_llm.engine import VERIFY_SIZES
      for K in VERIFY_SIZES: eng.verify(0, prompt[1:K])
      src = eng.speculator().source
      if hasattr(src, "eng"):  # a draft model: its prefill and decode steps (of long contexts: its own short_keys 0 here)
        short = src.eng.short_keys
        src.eng.short_keys = 0
        try: src.propose(prompt[:9], 3); src.propose(prompt[:3], 3)
        finally: src.eng.short_keys = short
        drafts.append(src.eng)
    for B in eng.batch_sizes:  # the other slots join slot 0, which keeps its sequence
      for slot in range(1, B): eng.prefill(slot, prompt[slot:slot + 5], s)
      for _ in range(2): eng.decode(list(range(B)), 2)
      for _ in range(2): eng.decode(list(range(B)), 1, masks=lambda: {0: allow.mask_words()})
      eng.set_mask(0, None)  # or the next batch size's plain decode would run (and compile) only the masked choice
    for B in eng.batch_sizes:  # the short prompts of clients that arrive together, in one step over B slots
      eng.prefill_together({b: ([prompt[(b + i) % len(prompt)] for i in range(2 + min(b, eng.group_rows - 2))], s) for b in range(B)})
      for b in range(B): eng.first_token(b)
  drafts = []
  t0 = time.monotonic()
  for k, (s, i) in enumerate(rounds):
    beat()
    try: one_round(s)
    except Exception as e:  # steps loaded from a file that do not run here: captured anew, the file rewritten
      if not getattr(eng, "steps_loaded", False): raise
      step_cache.discard(eng, f"{type(e).__name__}: {e}")
      one_round(s)
    if progress:
      c = kernel_cache.COUNTER
      log.info(f"prewarm: {k + 1}/{len(rounds)} {'greedy' if s.greedy else 'sampled'} prefill+decode, "
               f"{time.monotonic() - t0:.1f} s, kernels {c.hits} cached, {c.compiled} compiled, {c.searched} BEAM-searched")
  eng.reset()
  # a later start loads the captured steps rather than capturing them again (step_cache.py)
  step_cache.try_save(eng)
  for d in drafts[:1]: step_cache.try_save(d)
