"""Captured steps kept across starts: the engine's compiled steps (tinygrad TinyJits), pickled once
they are captured and unpickled by a later start of the same model shape and code (at a context up to
their reach), which then schedules and captures nothing (on the H200 that capture was most of a prewarmed start:
docs/PERF.md, start-up).

A captured step is a graph of kernel calls over buffers. The file holds the graph and the compiled
programs, not the buffers' contents:
- the engine's state (weights, KV cache, token buffers, rope tables: every Tensor that
  `state_tensors` finds) is written by name and bound, at load, to the loading engine's own buffers,
  which its loader has just filled (from the planes cache);
- every other buffer is a step's scratch, written inside the step before it is read: it is written
  as its size and type (and its place in a shared buffer, where the JIT's memory planner put several
  in one) and allocated afresh at load.
A buffer that a step reads but never writes and that is not state would be lost, so saving refuses
such a step. Fresh buffers get fresh tinygrad ids: the ids of the saving process would collide with
the loading process's own.

The file is named after everything that decides the steps: the kernel database's name (GPU arch,
tinygrad build and patches, model shape, BEAM width), the chunk length, the slots, the Python version
and this package's source, and the reach of its position variables (the context, or twice it where
a prewarm captured them: steps_reach); a file of another key is never read, and one that fails to load is
ignored (the engine captures as without it). The context is not in the key: a start at another
context loads the file of the smallest reach that holds its context (and is within its own reach,
so that the scratch stays what its own steps would hold), and binds its own KV caches,
position and rope tables and prompt buffer, whose rows follow the context (the state scales with the
KV cache's capacity, which the file records), so a change of context_length captures nothing.
"""
from __future__ import annotations
import dataclasses, functools, hashlib, io, os, pathlib, pickle, sys, time
from orin_llm.fileutil import atomic_write
from orin_llm import log

FORMAT = 4  # 2: a scratch buffer is one UOp at load, however often the steps name it; 3: steps by name (engine.Steps);
# 4: keyed without the context, state bound across capacities

# How far the steps a prewarm captures reach past the configured context: twice it, within the model's own context.
# Their position variables are bounded by the reach, and the prewarm's engine holds KV caches, tables and prompt buffer
# of the reach's capacity (in that process only), so that no index can pass a buffer's end: tinygrad then leaves the
# capacity out of the code (with bounds past a buffer's rows it wraps each position by a modulo of them: `&1023`), and
# with patches 0009 and 0024 the kernels are the same at every capacity. A step captured with wider bounds is correct
# for every position within them, so a later start at any context up to the reach loads the steps and
# binds its own smaller buffers: a change of context_length schedules nothing (issue 25; the fourteenth session's
# change 4352 -> 8448 spent 75 s on the H100 scheduling and compiling 17 steps). The cost, for a start at the prewarm's
# context: the JIT sized the scratch that a prefill chunk's scores take for the reach (6 bytes per head, chunk row and
# position: 403 MB more for a 1B's chunk of 512 at context 4096).
STEPS_REACH = 2

def steps_reach(max_context: int, model_context: int) -> int:
  """The positions a prewarm's steps are valid for: STEPS_REACH times the context, within the model's."""
  return max(max_context, min(model_context, STEPS_REACH * max_context))

def state_tensors(eng) -> dict:
  """Name -> every realized Tensor the engine holds outside its steps: weights, KV caches, position and rope
  tables, token, parameter and logits buffers."""
  from tinygrad import Tensor
  from tinygrad.nn.state import get_state_dict
  # the engine's own Tensors only: walking all of vars(eng) walked the GGUF's vocabulary too (0.26 s a call)
  sd = get_state_dict({"model": eng.model, "weights": eng.weights,
                       "state": {k: v for k, v in vars(eng.state).items() if isinstance(v, Tensor)}})
  from tinygrad.uop.ops import Ops
  return {k: t for k, t in sd.items() if t.uop.base.op is Ops.BUFFER}

@functools.cache  # the package's source does not change under a running process
def _source_hash() -> str:
  h = hashlib.sha256()
  for p in sorted(pathlib.Path(__file__).parent.rglob("*.py")): h.update(p.name.encode() + p.read_bytes())
  return h.hexdigest()

def _opts_env() -> dict:
  """The settings of the hand-coded opts (tinygrad's matvec heuristic, patches 0003, 0013, 0017, 0020, 0022: MV_*; the
  tensor-core products', 0032, 0034, 0036: TC_*; the rows over keys, 0033: RED_KEYS; the sums of squares' switches, 0042 and 0049: GROUP_ONE, ROW_SQUARES,
  FEW_ROW_SQUARES; the BEAM search's bounds), which the
  kernel database does not key, the decode attention's segments (model.SEGMENTS), the chunk products' split
  (quant.SPLIT_LEN), the affine form's types, rows and codes (quant.AFFINE, AFFINE_ROWS, ORIN_LLM_AFFINE_MANTISSA), the few rows' tensor-core form
  (quant.TC_ROWS, its parts, floor and codes: ORIN_LLM_TC_WARPS, ORIN_LLM_TC_MIN_WEIGHTS, ORIN_LLM_TC_PAIRS,
  ORIN_LLM_TC_CHUNK_ROWS, ORIN_LLM_SPLIT_SUMS), the several
  sequences' one store (model.ONE_STORE: ORIN_LLM_ONE_STORE), the short steps' bound (model.SHORT_KEYS) and the steps BEAM searches
  (settings.BEAM_STEPS): steps compiled under other values
  are other programs."""
  from orin_llm.settings import SEARCH_DEFAULTS
  env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("MV_", "TC_")) or k in ("RED_KEYS", "GROUP_ONE", "ROW_SQUARES", "FEW_ROW_SQUARES", "ORIN_LLM_DECODE_SEGMENTS", "ORIN_LLM_ATTN_MATRIX_ROWS", "ORIN_LLM_MERGED_SCORES_ROWS", "ORIN_LLM_CHUNK_SPLIT", "ORIN_LLM_CHUNK_PV_PARTS", "ORIN_LLM_GROUP_ROWS", "ORIN_LLM_TC_WARPS", "ORIN_LLM_TC_MIN_WEIGHTS", "ORIN_LLM_TC_PAIRS", "ORIN_LLM_AFFINE_MANTISSA", "ORIN_LLM_ONE_STORE")}
  from orin_llm import quant
  # as in effect: unset and 1 are the same programs, so are "Q4_K,Q6_K" and "Q6_K,Q4_K", and any rows with no type
  env["ORIN_LLM_AFFINE"] = ",".join(sorted(t.name for t in quant.AFFINE))
  env["ORIN_LLM_AFFINE_ROWS"] = str(quant.AFFINE_ROWS if quant.AFFINE else 1)
  env["ORIN_LLM_TC_ROWS"] = str(quant.TC_ROWS)  # the few-row products' fused tensor-core form
  env["ORIN_LLM_TC_CHUNK_ROWS"] = str(quant.TC_CHUNK_ROWS)  # small chunks without float16 copies in that form
  env["ORIN_LLM_SPLIT_SUMS"] = str(quant.SPLIT_SUMS)  # a fused weight's members' parts summed apart
  from orin_llm import model
  env["ORIN_LLM_ONE_STORE"] = str(model.ONE_STORE)  # unset and 1 are the same programs
  env["ORIN_LLM_SHORT_KEYS"] = str(model.SHORT_KEYS)  # whether the warm-up captured the short steps (and up to where they run)
  from orin_llm import settings
  env["ORIN_LLM_BEAM_STEPS"] = settings.BEAM_STEPS  # which steps a search took (engine.searched)
  # the search's bounds ([beam] time_limit and min_us), as in effect: steps captured after a shorter search are not loaded
  # by a server configured for the default one, which captures its own and searches what the shorter one left out
  def number(v: str) -> str:  # "5", "5.0" and "5e0" are one bound
    try: return repr(float(v))
    except ValueError: return v
  return env | {k: number(os.environ.get(k, SEARCH_DEFAULTS[k])) for k in ("BEAM_TIME_LIMIT", "BEAM_MIN_US")}

def _key_hash(eng) -> str:
  from orin_llm.kernel_cache import model_shape
  key = {"format": FORMAT, "db": eng.kernel_db.name, "model": model_shape(eng.cfg, eng.file.tensors), "chunks": eng.chunks, "slots": eng.max_batch, "dense": eng.dense_bytes > 0, "device": eng.device,
         "python": sys.version_info[:2], "source": _source_hash(), "opts_env": _opts_env()}
  return hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:16]

def path_for(eng) -> pathlib.Path | None:
  """The file the engine's own steps are kept in, next to its kernel database (None without one: no cache directory)."""
  if eng.kernel_db is None: return None
  return eng.kernel_db.parent / f"steps-{_key_hash(eng)}-reach{eng.reach}.pkl"

def find(eng) -> pathlib.Path | None:
  """The steps file this engine can load: of its key, and of the smallest reach that holds its context and is within the
  reach a prewarm at its context would capture (a file of a larger one holds the scratch that reach sizes: a context
  lowered to save memory captures its own steps)."""
  if eng.kernel_db is None: return None
  h, files, most = _key_hash(eng), [], steps_reach(eng.max_context, eng.cfg.context_length)
  for p in eng.kernel_db.parent.glob(f"steps-{h}-reach*.pkl"):
    reach = p.stem.removeprefix(f"steps-{h}-reach")
    if reach.isdigit() and eng.max_context <= int(reach) <= most: files.append((int(reach), p))
  return min(files)[1] if files else None

def scratch_bytes(eng) -> dict:
  """step name -> bytes of device memory a captured step holds beside the engine's state: its scratch
  (the JIT's memory planner puts it in one arena per step)."""
  from tinygrad.uop.ops import Ops, buffers
  state, out = set(_buffer_uops(eng)), {}
  for key, j in eng.steps.jits.items():
    if j.captured is None: continue
    bases = {id(b.base): b.base.nbytes for u in j.captured.linear.toposort()
             if u.op is Ops.BUFFER and u.arg.device is not None and u not in state and (b := buffers.get(u)) is not None}
    out[key] = sum(bases.values())
  return out

# ------------------------------------------------------------------ writing

def _buffer_uops(eng) -> dict:
  """BUFFER UOp -> state name."""
  return {t.uop.base: name for name, t in state_tensors(eng).items()}

class _Pickler(pickle.Pickler):
  def __init__(self, f, state: dict, written: set, capacity: int):
    super().__init__(f, protocol=5)
    self.state, self.written, self.bases, self.uids, self.capacity = state, written, {}, {}, capacity
  def persistent_id(self, obj):
    from tinygrad.uop.ops import UOp, Ops, buffers
    # device buffers only: kernels' own code holds BUFFER UOps of registers and local memory too
    if type(obj) is not UOp or obj.op is not Ops.BUFFER or obj.arg.device is None: return None
    if (name := self.state.get(obj)) is not None: return ("state", name, obj.arg.dtype, buffers[obj].size, self.capacity)
    if obj not in self.written: raise ValueError(f"a step reads a buffer that is neither engine state nor written by a step: {obj.arg}")
    # the UOp's fields but its id (slot), which the loading process gives afresh; uid: one UOp there for each here
    # (pickle memoizes no persistent ids), the UOp kept alive until the dump ends so that its id() stays its own
    uid = self.uids.setdefault(id(obj), (len(self.uids), obj))[0]
    fields = (obj.dtype, obj.src, {f.name: getattr(obj.arg, f.name) for f in dataclasses.fields(obj.arg) if f.name != "slot"}, obj.tag)
    if (buf := buffers.get(obj)) is None: return ("scratch", uid, fields, None)
    base = buf.base
    bid = self.bases.setdefault(id(base), (len(self.bases), base))[0]  # the base kept alive until the dump ends
    return ("scratch", uid, fields, (bid, base.device, base.size, base.dtype, base.options, buf.size, buf.dtype,
                                     buf.offset if buf._base is not None else None))

def save(eng, path: str | os.PathLike) -> int:
  """Writes the engine's captured steps to path (atomically); returns the file's size."""
  jits = {k: j for k, j in eng.steps.jits.items() if j.captured is not None}
  written = set()
  for j in jits.values():
    for u in j.captured._written_uops: written.add(u)
  path = pathlib.Path(path)
  buf = io.BytesIO()
  _Pickler(buf, _buffer_uops(eng), written, eng.model.capacity).dump({"format": FORMAT, "jits": jits})
  atomic_write(path, buf.getbuffer())
  return buf.tell()

# ------------------------------------------------------------------ reading

class _Unpickler(pickle.Unpickler):
  def __init__(self, f, state: dict, capacity: int):
    super().__init__(f)
    self.state, self.bases, self.uops, self.capacity = state, {}, {}, capacity
  def persistent_load(self, pid):
    from tinygrad.uop.ops import UOp, Ops, ParamArg, buffers
    from tinygrad.device import Buffer
    if pid[0] == "state":
      _, name, dtype, size, capacity = pid
      # the same size, or (captured at another context) the same rows per row of the KV cache's capacity: the caches,
      # position and rope tables and the prompt buffer, whose rows the kernels index by position, never by stride
      if (u := self.state.get(name)) is None or u.arg.dtype != dtype or (buffers[u].size != size and buffers[u].size * capacity != size * self.capacity):
        raise ValueError(f"the steps read {name} ({dtype}, {size} at capacity {capacity}), which this engine holds " +
                         ("not" if u is None else f"as ({u.arg.dtype}, {buffers[u].size} at capacity {self.capacity})"))
      return u
    _, uid, (dtype, src, arg, tag), desc = pid
    if uid in self.uops: return self.uops[uid]
    fresh = self.uops[uid] = UOp(Ops.BUFFER, dtype, src, ParamArg(slot=next(UOp.unique_num), **arg), tag)
    if desc is not None:
      bid, dev, size, dtype, options, vsize, vdtype, offset = desc
      if bid not in self.bases: self.bases[bid] = Buffer(dev, size, dtype, options=options).allocate()
      base = self.bases[bid]
      b = base if offset is None else base.view(vsize, vdtype, offset)
      buffers[fresh] = b.ref(1)
    return fresh

def load(eng, path: str | os.PathLike) -> dict:
  """The captured steps in path, bound to this engine's buffers: {step name: TinyJit}."""
  state = _buffer_uops(eng)
  with open(path, "rb") as f: data = _Unpickler(f, {n: u for u, n in state.items()}, eng.model.capacity).load()
  if data.get("format") != FORMAT: raise ValueError(f"format {data.get('format')}, expected {FORMAT}")
  return data["jits"]

def try_load(eng) -> pathlib.Path | None:
  """Installs the engine's steps from its steps file and returns its path; None (and the engine captures
  its steps on first use) when there is none or it cannot be read."""
  from tinygrad.helpers import JIT
  if (path := find(eng)) is None: return None
  if not JIT.value:  # JIT=0 runs every step uncompiled, which a loaded step cannot (it has only its capture)
    log.info(f"captured steps: JIT=0, not using {path}")
    return None
  t0 = time.monotonic()
  try: jits = load(eng, path)
  except Exception as e:
    log.info(f"captured steps: cannot use {path} ({type(e).__name__}: {e}); capturing them anew")
    return None
  eng.steps.jits.update(jits)
  log.info(f"captured steps: {len(jits)} loaded from {path} in {time.monotonic() - t0:.1f} s")
  return path

def try_save(eng) -> pathlib.Path | None:
  """Writes the engine's captured steps to its steps file, unless it has none or the file exists."""
  if getattr(eng, "steps_file", None) is not None: return None  # loaded (perhaps from another context's file, which serves this one)
  if (path := path_for(eng)) is None or path.exists() or not any(j.captured is not None for j in eng.steps.jits.values()): return None
  t0 = time.monotonic()
  try:
    size = save(eng, path)
    scratch = sum(scratch_bytes(eng).values())
  except Exception as e:
    log.info(f"captured steps: not kept ({type(e).__name__}: {e})")
    return None
  eng.steps_file = path
  log.info(f"captured steps: {len(eng.steps.jits)} kept in {path} ({size / 2**20:.1f} MiB, {time.monotonic() - t0:.1f} s; "
           f"their scratch on the device: {scratch / 2**20:.0f} MiB)")
  return path

def discard(eng, why: str):
  """Forgets loaded steps that failed to run: the engine captures its steps anew, and the file is rewritten."""
  log.info(f"captured steps: {eng.steps_file} failed ({why}); capturing them anew")
  if eng.steps_file is not None: pathlib.Path(eng.steps_file).unlink(missing_ok=True)
  eng.steps.jits.clear()
  eng.steps_file, eng.steps_loaded = None, False
