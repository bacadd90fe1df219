"""Server configuration: a TOML file (`--config`) overridden by command-line flags. A bad file, an
unknown key or a bad value stops start-up with one line naming the key."""
from __future__ import annotations
import pathlib, tomllib
from dataclasses import dataclass, replace
from orin_llm.errors import OrinError
from orin_llm import settings

@dataclass(frozen=True)
class ServerConfig:
  model: str | None = None             # GGUF file; None: orin_llm.settings.default_model()
  host: str = "127.0.0.1"
  port: int = 8080
  context_length: int | None = None    # None: min(model's, engine.DEFAULT_CONTEXT)
  api_key: str | None = None           # Bearer token for /v1/*; None: no authentication
  api_key_file: str | None = None      # the same, read from a file (systemd LoadCredential=)
  queue_size: int = 16                 # requests waiting behind the running one; more get 429
  max_tokens_default: int = 512        # max_tokens when a request gives none
  max_batch: int = 4                   # KV-cache slots: requests generating at once (continuous batching)
  gather_ms: float = 0.0               # ms an idle engine that took a job waits for requests still being read (worker.Worker._join)
  prefill_copy_mb: int = 8192          # MiB of device memory for float16 copies of the layers' matrices, which prefill multiplies (0: none; quant.DEFAULT_PREFILL_COPY_MB)
  speculative: str = "off"             # "ngram": a request generating alone checks proposed tokens several at a time
  draft_model: str | None = None       # a small GGUF model of the same vocabulary that proposes tokens (speculative decoding)
  beam_width: int = 0                  # [beam] width: tinygrad BEAM search (0: off)
  beam_workers: int | None = None      # [beam] workers: processes of the search (None: tinygrad's default)
  beam_time_limit: float | None = None # [beam] time_limit: seconds of search per kernel (None: settings.SEARCH_DEFAULTS, 30)
  beam_min_us: float | None = None     # [beam] min_us: a kernel under this many us a step with the hand-coded opts is not searched (None: 300)
  kernel_cache_directory: str | None = None  # [kernel_cache] directory: kernel databases and repacked planes (None: settings.cache_dir())
  kernel_cache_shipped: str | None = None    # [kernel_cache] shipped: read-only prebuilt database (file or directory), copied in when missing
  hugepages: str | None = None         # "auto" | "off": host staging buffers in huge pages (hostmem.py); None: $ORIN_LLM_HUGEPAGES, else auto
  # limits (docs/SERVER.md, "Limits and hardening")
  max_prompt_tokens: int | None = None # prompt tokens a request may have; None: what the context holds (context - 1)
  max_connections: int = 256           # open connections; past it the slowest idle one is dropped, else 503
  header_timeout: float = 10.0         # seconds from a request's first byte to the end of its headers
  body_timeout: float = 30.0           # seconds to receive a request's body
  keepalive_timeout: float = 15.0      # seconds a connection may stay open between requests
  template_timeout: float = 5.0        # seconds to render a chat template and tokenize a prompt (worker process)
  template_memory_mb: int = 256        # MiB of address space the worker may add to what it starts with
  template_max_output: int = 4 << 20   # characters of a rendered prompt, and of any string a template builds
  parse_special_in_content: bool = False  # true: control tokens written in messages are parsed (the old behaviour)

# key in the file -> (field, accepted types, check of the value or None, what the check wants)
def _positive(v): return v > 0
def _seconds(v): return 0 < v <= 3600
_KEYS = {
  "model": ("model", str, None, ""), "host": ("host", str, bool, "a non-empty string"),
  "port": ("port", int, lambda v: 1 <= v <= 65535, "an integer in 1..65535"),
  "context_length": ("context_length", int, lambda v: v >= 2, "an integer >= 2"),
  "api_key": ("api_key", str, bool, "a non-empty string"), "api_key_file": ("api_key_file", str, bool, "a non-empty string"),
  "queue_size": ("queue_size", int, _positive, "a positive integer"),
  "max_tokens_default": ("max_tokens_default", int, _positive, "a positive integer"),
  "max_batch": ("max_batch", int, lambda v: 1 <= v <= 64, "an integer in 1..64"),
  "gather_ms": ("gather_ms", float, lambda v: 0 <= v <= 100, "a number of milliseconds in 0..100"),
  "prefill_copy_mb": ("prefill_copy_mb", int, lambda v: 0 <= v <= 1 << 24, "an integer (MiB) in 0..16777216"),
  "speculative": ("speculative", str, lambda v: v in ("off", "ngram"), '"off" or "ngram"'),
  "draft_model": ("draft_model", str, bool, "a non-empty string"),
  "hugepages": ("hugepages", str, lambda v: v in ("auto", "off"), '"auto" or "off"'),
  "max_prompt_tokens": ("max_prompt_tokens", int, _positive, "a positive integer"),
  "max_connections": ("max_connections", int, lambda v: 1 <= v <= 1 << 20, "an integer in 1..1048576"),
  "header_timeout": ("header_timeout", float, _seconds, "a number of seconds in (0, 3600]"),
  "body_timeout": ("body_timeout", float, _seconds, "a number of seconds in (0, 3600]"),
  "keepalive_timeout": ("keepalive_timeout", float, _seconds, "a number of seconds in (0, 3600]"),
  "template_timeout": ("template_timeout", float, _seconds, "a number of seconds in (0, 3600]"),
  "template_memory_mb": ("template_memory_mb", int, lambda v: 16 <= v <= 1 << 20, "an integer (MiB) >= 16"),
  "template_max_output": ("template_max_output", int, lambda v: 1024 <= v <= 1 << 30, "an integer (characters) in 1024..2^30"),
  "parse_special_in_content": ("parse_special_in_content", bool, None, "true or false"),
}
_TABLES = {
  "beam": {"width": ("beam_width", int, lambda v: v >= 0, "an integer >= 0"), "workers": ("beam_workers", int, _positive, "a positive integer"),
           "time_limit": ("beam_time_limit", float, _seconds, "a number of seconds in (0, 3600]"),
           "min_us": ("beam_min_us", float, lambda v: 0 <= v <= 1e9, "a number of microseconds in 0..1e9")},
  "kernel_cache": {"directory": ("kernel_cache_directory", str, bool, "a non-empty string"),
                   "shipped": ("kernel_cache_shipped", str, bool, "a non-empty string")},
}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}

def _check(where: str, key: str, value, spec) -> tuple[str, object]:
  name, typ, ok, wants = spec
  # TOML booleans are ints to Python: refuse them where a number is wanted; a float key takes integers too
  if not isinstance(value, (int, float) if typ is float else typ) or (typ in (int, float) and isinstance(value, bool)):
    raise OrinError(f"{where}: {key} must be {wants or _TYPE_NAMES[typ]}, not {type(value).__name__} {value!r}")
  if ok is not None and not ok(value): raise OrinError(f"{where}: {key} must be {wants}, not {value!r}")
  return name, float(value) if typ is float else value

def from_toml(path: str | pathlib.Path) -> ServerConfig:
  try: data = tomllib.loads(pathlib.Path(path).read_text())
  except OSError as e: raise OrinError(f"{path}: cannot read the config file: {e.strerror or e}") from None
  except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e: raise OrinError(f"{path}: not valid TOML: {e}") from None
  return from_dict(data, str(path))

def from_dict(data: dict, where: str = "config") -> ServerConfig:
  values = {}
  for key, value in data.items():
    if key in _KEYS: k, v = _check(where, key, value, _KEYS[key]); values[k] = v
    elif key in _TABLES:
      if not isinstance(value, dict): raise OrinError(f"{where}: {key} must be a table ([{key}])")
      for sub, v in value.items():
        if sub not in _TABLES[key]: raise OrinError(f"{where}: unknown key {key}.{sub} (known: {', '.join(_TABLES[key])})")
        k, v = _check(where, f"{key}.{sub}", v, _TABLES[key][sub]); values[k] = v
    else: raise OrinError(f"{where}: unknown key {key!r} (known: {', '.join([*_KEYS, *_TABLES])})")
  return ServerConfig(**values)

def resolve(args) -> ServerConfig:
  """The configuration of `orin-llm serve`: the file, then the flags, then checks that need the file system."""
  cfg = from_toml(args.config) if args.config else ServerConfig()
  flags = {"model": args.model, "host": args.host, "port": args.port, "context_length": args.context,
           "api_key_file": args.api_key_file, "queue_size": args.queue_size, "max_batch": getattr(args, "max_batch", None)}
  where = "command line"
  for k, v in flags.items():
    if v is None: continue
    flag = {"context_length": "--context", "api_key_file": "--api-key-file", "queue_size": "--queue-size", "max_batch": "--max-batch"}.get(k, f"--{k}")
    spec = _KEYS[k]
    _check(where, flag, v, spec)
    cfg = replace(cfg, **{k: v})
    if k == "api_key_file": cfg = replace(cfg, api_key=None)  # the flag replaces whatever key the file gave
  if cfg.api_key and cfg.api_key_file: raise OrinError(f"{args.config}: give api_key or api_key_file, not both")
  if cfg.api_key_file:
    try: key = pathlib.Path(cfg.api_key_file).read_text().strip()
    except OSError as e: raise OrinError(f"api_key_file: cannot read {cfg.api_key_file}: {e.strerror or e}") from None
    if not key: raise OrinError(f"api_key_file: {cfg.api_key_file} is empty")
    cfg = replace(cfg, api_key=key)
  if cfg.model is None: cfg = replace(cfg, model=str(settings.default_model()))
  if not pathlib.Path(cfg.model).is_file(): raise OrinError(f"model: {cfg.model}: model file not found")
  if cfg.draft_model and not pathlib.Path(cfg.draft_model).is_file(): raise OrinError(f"draft_model: {cfg.draft_model}: model file not found")
  return cfg

def apply(cfg: ServerConfig):
  """The config's process settings (settings.py), as `serve` and `prewarm --config` apply them: [beam]
  width (0 leaves $BEAM), workers and the search's bounds (time_limit, min_us: unset leaves the environment's, else
  settings.SEARCH_DEFAULTS'), host huge pages, the [kernel_cache] directory (created here)."""
  settings.apply(beam=cfg.beam_width or None, workers=cfg.beam_workers, hugepages=cfg.hugepages,
                 cache=cfg.kernel_cache_directory, search=search_bounds(cfg))

def search_bounds(cfg: ServerConfig) -> dict[str, float]:
  """The config's bounds of each kernel's BEAM search, as tinygrad's variables (patches 0011, 0019)."""
  return {k: v for k, v in (("BEAM_TIME_LIMIT", cfg.beam_time_limit), ("BEAM_MIN_US", cfg.beam_min_us)) if v is not None}
