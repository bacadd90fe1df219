"""The warm-up: the steps the server replays, run once so that they are compiled (kernel_cache.py) and
captured (step_cache.py) before the first request. One routine for the server's warm-up before READY=1
(server/worker.py) and `orin-llm prewarm` (prewarm.py), so whatever the server compiles is what prewarm
cached."""
from __future__ import annotations
import time
from orin_llm import log

def warm_up_prompt(eng) -> list[int]:
  """A prompt of two prefill chunks (the second partial), within the context."""
  n = max(1, min(eng.chunk + eng.chunk // 2 + 1, eng.max_context - 8))
  return [(7 + 31 * i) % eng.cfg.vocab_size for i in range(n)]

def warm_up(eng, beat=lambda: None, progress: bool = False):
  """Captures the compiled steps the server replays: prefill (more than one chunk, so the JIT sees
  chunk_len and start_pos move) and decode, greedy and sampled. The engine's JITs capture on their first
  call, and a generation calls each step more than once, so one generation per variant captures and
  replays both steps. beat() runs between generations (the server's heartbeat). BEAM searches at the
  variables' midpoints, whatever the prompt."""
  from orin_llm.sampling import Sampling
  from orin_llm import kernel_cache
  from orin_llm import step_cache
  prompt = warm_up_prompt(eng)
  steps = [(s, i) for s in (Sampling(), Sampling(1.0, 40, 0.9, 0)) for i in range(2)]  # the second: replays only
  t0 = time.monotonic()
  for k, (s, i) in enumerate(steps):
    beat()
    eng.cached = []  # from scratch each time: prefill runs all its chunks
    try:
      for _ in eng.generate(prompt, 4, s): pass
    except Exception as e:  # steps loaded from a file that do not run here: captured anew, the file rewritten
      if not getattr(eng, "steps_loaded", False): raise
      step_cache.discard(eng, f"{type(e).__name__}: {e}")
      eng.cached = []
      for _ in eng.generate(prompt, 4, s): pass
    if progress:
      c = kernel_cache.COUNTER
      log.info(f"prewarm: {k + 1}/{len(steps)} {'greedy' if s.greedy else 'sampled'} prefill+decode, "
               f"{time.monotonic() - t0:.1f} s, kernels {c.hits} cached, {c.compiled} compiled, {c.searched} BEAM-searched")
  eng.cached = []
  # a later start loads the captured steps rather than capturing them again (step_cache.py)
  step_cache.try_save(eng)
