"""tinygrad's kernel cache, one SQLite file per (GPU arch, tinygrad build, model shape, BEAM width).

tinygrad keeps compiled programs and BEAM search results in one database (`CACHEDB`) whose keys
hold no GPU architecture, so a database filled on one GPU must not be used on another. We choose
the file ourselves:
    <dir>/kernels-<device>-<arch>-tinygrad<version>+<patches8>-<model8>-beam<N>.db
dir: --cache, [kernel_cache] directory, $ORIN_LLM_CACHE_DIR, else ~/.cache/orin-llm (settings.py). The model
hash covers the ModelConfig and the tensors' shapes and types, not the weights nor the context
length (kernels of another context land in the same file; tinygrad's keys tell them apart).

tinygrad opens the database lazily, at its first lookup, from the module global `CACHEDB`, so
`use()` may switch files after import as long as it also drops an open connection. It runs SQLite
in WAL mode, which cannot open a read-only file: a shipped database is copied first.

`Counter` counts lookups (compiled programs and BEAM results) served from the file (hits) and
compiled or searched (misses), so a server can say whether anything compiled after READY, and
notes when compiling or BEAM search last made progress, so that the server's watchdog can tell a
long search from a stuck thread.
"""
from __future__ import annotations
import dataclasses, hashlib, json, logging, os, pathlib, platform, re, shutil, time
from orin_llm.fileutil import AtomicFile
from orin_llm.settings import cache_dir, beam_width  # the directory and BEAM width are settings (engine.py calls cache_dir here)

logger = logging.getLogger("orin_llm")

def _h8(obj) -> str: return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]
def _clean(s: str) -> str: return re.sub(r"[^A-Za-z0-9_.]+", "-", s).strip("-").lower()

def device_arch(device: str) -> tuple[str, str]:
  """('cuda', 'sm_87') for a CUDA device (opens it: the compute capability comes from the driver),
  ('cpu', 'x86_64-native') for tinygrad's CPU backend, whose programs are built for this host."""
  from tinygrad import Device
  dev = Device[device]
  arch = getattr(dev, "arch", None) or platform.machine()
  return _clean(device.split(":")[0]), _clean(str(arch))

def tinygrad_build() -> str:
  """tinygrad's version and the patch series applied to it: a patch can change the kernels it generates."""
  import importlib.metadata
  try: ver = importlib.metadata.version("tinygrad")
  except importlib.metadata.PackageNotFoundError: ver = "unknown"
  try: from tinygrad.orin_llm_patches import PATCHES
  except ImportError: PATCHES = ()
  return f"{ver}+{_h8(list(PATCHES))}"

def model_shape(cfg, tensors) -> str:
  """Hash of what decides the kernels: the config and each tensor's shape and type (not the weights)."""
  return _h8([dataclasses.asdict(cfg), sorted((t.name, list(t.shape), t.qtype.name) for t in tensors.values())])

def db_name(device: str, arch: str, build: str, shape: str, beam: int) -> str:
  return f"kernels-{device}-{arch}-tinygrad{build}-{shape}-beam{beam}.db"

def install_shipped(target: pathlib.Path, shipped: str | os.PathLike | None) -> bool:
  """Copies the shipped database (a file, or a directory holding one of target's name) to target
  when target is missing. The copy is writable whatever the source's mode; True if it copied."""
  if not shipped or target.exists(): return False
  src = pathlib.Path(shipped)
  if src.is_dir(): src = src / target.name
  if not src.is_file(): return False
  target.parent.mkdir(parents=True, exist_ok=True)
  # atomic: another process never sees half a database
  with AtomicFile(target) as out, open(src, "rb") as f: shutil.copyfileobj(f, out, 1 << 20)
  logger.info(f"kernel cache: copied the shipped {src} to {target}")
  return True

# tinygrad keeps one connection per thread (patch 0005) in helpers._db_connections, a threading.local
def _connection():
  from tinygrad import helpers
  return getattr(helpers._db_connections, "conn", None)

_stale: list = []  # connections inherited by forked workers: never used nor closed there (closing would checkpoint the WAL)
def _after_fork_in_child():
  import threading
  from tinygrad import helpers
  if (conn := _connection()) is not None: _stale.append(conn)
  helpers._db_connections = threading.local()
os.register_at_fork(after_in_child=_after_fork_in_child)  # SQLite connections must not cross fork()

def use(path: str | os.PathLike):
  """Points tinygrad at the database file: for this process (closing a connection opened on another
  file) and for BEAM/compile workers started later (they read $CACHEDB at import)."""
  from tinygrad import helpers
  path = str(pathlib.Path(path).absolute())
  os.environ["CACHEDB"] = path
  if helpers.CACHEDB == path and _connection() is not None: return
  helpers.CACHEDB = path
  if (conn := _connection()) is not None: conn.close()
  import threading
  helpers._db_connections = threading.local()  # every thread reopens, on the new file
  helpers._db_tables.clear()
  from tinygrad.engine.worker import terminate_worker_pool
  terminate_worker_pool()  # spawned workers hold the old file

def select(directory, device: str, cfg, tensors, beam: int | None = None, shipped=None) -> pathlib.Path:
  """Chooses, installs (from shipped) and uses the database for this model on this device."""
  d = cache_dir(directory)
  try: d.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    from orin_llm.errors import OrinError
    raise OrinError(f"kernel cache: cannot create {d}: {e.strerror or e}") from None
  dev, arch = device_arch(device)
  path = d / db_name(dev, arch, tinygrad_build(), model_shape(cfg, tensors), beam_width() if beam is None else beam)
  install_shipped(path, shipped)
  use(path)
  COUNTER.install()
  COUNTER.path = str(path)
  logger.info(f"kernel cache: {path}" + ("" if path.exists() else " (new: kernels compile on first use, which takes a while)"))
  return path

@dataclasses.dataclass(frozen=True)
class Prepared:
  """A model file opened and the kernel database chosen for it (prepare): what an Engine with a cache takes."""
  file: object
  cfg: object
  db: pathlib.Path

def prepare(model, directory=True, device: str | None = None, shipped=None) -> Prepared:
  """Opens the model file's header and chooses, installs and uses its kernel database in directory (True: the default
  cache directory): process-wide state (tinygrad's CACHEDB, the counters), so a command calls this where it starts,
  before it builds the engine (Engine(model, kernel_db=prepare(...)))."""
  from tinygrad import Device
  from orin_llm.loader import open_model
  f, cfg = open_model(model)
  return Prepared(f, cfg, select(None if directory is True else directory, device or Device.DEFAULT, cfg, f.tensors, shipped=shipped))

# ---------------------------------------------------------------- hit and miss counting

class Counter:
  """Counts cache lookups of the kernels this process runs (programs and BEAM results). Programs are
  compiled in this process (always when BEAM is on) or, for batches of kernels with BEAM off, in
  tinygrad's worker pool, where nothing can be counted: those are attributed from the rows the
  batch added to the database (max(rowid) grows by one per insert)."""
  def __init__(self):
    self.hits = self.misses = self.searched = self.compiled = 0
    self.path: str | None = None
    self.progress = 0.0  # time.monotonic() of the last lookup, compile or BEAM candidate timed in this process
    self._installed = self._warned = False

  def progressed(self, within: float) -> bool:
    """Compiling or BEAM search made progress within the last `within` seconds. A kernel first met at
    request time can search for minutes; each candidate it times counts."""
    return time.monotonic() - self.progress < within

  def snapshot(self) -> dict:
    return {"path": self.path, "hits": self.hits, "misses": self.misses, "compiled": self.compiled, "searched": self.searched}
  def _miss(self, what: str, n: int = 1):
    self.misses += n
    if what == "compiling": self.compiled += n
    else: self.searched += n
    if not self._warned:
      self._warned = True
      logger.info(f"kernel cache: {what} kernels that are not in {self.path}: this takes a while (`orin-llm prewarm` fills the cache ahead)")

  def install(self):
    if self._installed: return
    self._installed = True
    from tinygrad import device
    from tinygrad.engine import realize
    from tinygrad.codegen.opt import search
    pid, c = os.getpid(), self
    orig_device_get, orig_search_get, orig_lower = device.diskcache_get, search.diskcache_get, realize.lower_and_compile
    orig_time = search._time_program
    # tinygrad's own lookups, counted where its modules call them: Compiler.compile_cached (device.py) looks
    # up a program, beam_search (search.py) a BEAM result; a None is a miss that tinygrad then compiles or searches
    def program_get(table, key):
      val = orig_device_get(table, key)
      c.progress = time.monotonic()
      if os.getpid() == pid:
        c._in_parent += 1
        if val is None: c._miss("compiling")
        else: c.hits += 1
      return val
    def beam_get(table, key):
      val = orig_search_get(table, key)
      c.progress = time.monotonic()
      if table == "beam_search" and os.getpid() == pid:
        if val is None: c._miss("BEAM-searching")
        else: c.hits += 1
      return val
    def lower_and_compile(linear):
      n0, rows0, compiled0 = len(realize.to_program_cache), c._rows(), c.compiled
      c._in_parent = 0
      out = orig_lower(linear)
      c.progress = time.monotonic()
      if (in_pool := len(realize.to_program_cache) - n0 - c._in_parent) > 0:
        missed = min(in_pool, max(0, c._rows() - rows0 - (c.compiled - compiled0)))
        c.hits += in_pool - missed
        if missed: c._miss("compiling", missed)
      return out
    def time_program(*args, **kwargs):  # beam_search times each candidate through this module global
      c.progress = time.monotonic()
      return orig_time(*args, **kwargs)
    from tinygrad.engine import worker
    orig_watched = worker.imap_unordered_watched
    def watched(*args, **kwargs):  # lower_and_compile's pool compiles before a search (patch 0035): each result is progress
      for r in orig_watched(*args, **kwargs):
        c.progress = time.monotonic()
        yield r
    self._in_parent = 0
    device.diskcache_get, search.diskcache_get, realize.lower_and_compile = program_get, beam_get, lower_and_compile
    search._time_program, worker.imap_unordered_watched = time_program, watched

  def _rows(self) -> int:
    """Inserts into the compile tables so far: the sum of their max(rowid), an index lookup each."""
    from tinygrad import helpers
    try:
      cur = helpers.db_connection().cursor()
      tables = [r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'compile%'")]
      return sum(cur.execute(f"SELECT coalesce(max(rowid), 0) FROM '{t}'").fetchone()[0] for t in tables)
    except Exception: return 0  # counting must never break compiling

COUNTER = Counter()
