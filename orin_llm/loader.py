"""From a GGUF file to device tensors: matrices repacked into quantized planes, vectors as float32.

Repacking is CPU work (seconds for a 1B model on the Orin), so its output can be kept: `PlanesCache`
writes every tensor's planes to one flat file next to the kernel cache, with a JSON index keyed by
the model file's size, mtime and header hash and FORMAT; a later load maps the file and uploads
the planes as they are."""
from __future__ import annotations
import hashlib, json, mmap, pathlib, time
import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor
from orin_llm.config import ModelConfig, config_from_gguf
from orin_llm.gguf_file import GGUFFile
from orin_llm.quant import QuantWeight, repack
from orin_llm import hostmem, log
from orin_llm.fileutil import AtomicFile, atomic_write

UPLOAD_BATCH = 256 << 20
FORMAT = 3  # bump when repack's output changes (2: fused weights stored stacked; 3: Q6_K's qh2 in 16-bit units)
ALIGN = 4096

class PlanesCache:
  """planes-<key>.bin (planes back to back, each ALIGN-aligned) and planes-<key>.json (the index,
  written last: a file without its index is an unfinished write and is ignored)."""
  def __init__(self, directory, f: GGUFFile, fuse: dict[str, list[str]] | None = None):
    st = f.path.stat()
    with open(f.path, "rb") as fh: header = hashlib.sha256(fh.read(f.data_start)).hexdigest()
    # the fusion decides which names the index holds (a stacked group or its members)
    fused = hashlib.sha256(json.dumps(sorted((fuse or {}).items())).encode()).hexdigest()[:16]
    self.ident = {"format": FORMAT, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "header": header, "fuse": fused}
    key = hashlib.sha256(json.dumps(self.ident, sort_keys=True).encode()).hexdigest()[:16]
    self.dir = pathlib.Path(directory)
    self.bin, self.index = self.dir / f"planes-{key}.bin", self.dir / f"planes-{key}.json"
    self._out, self.model = None, str(f.path.absolute())

  def read(self) -> dict[str, dict[str, np.ndarray]] | None:
    """name -> planes (views of the mapped file, writable copy-on-write pages), or None when absent or stale.
    No hostmem staging here: page-cache pages cannot be huge pages, and reading each tensor into a
    huge-page buffer first adds a copy; on x86 that load took 3.7 s instead of 2.9 s (README.md)."""
    try: idx = json.loads(self.index.read_text())
    except (OSError, ValueError): return None
    if idx.get("ident") != self.ident: return None
    try:
      with open(self.bin, "rb") as fh: mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError): return None
    if len(mm) != idx["bytes"]: return None
    # plain ndarrays (tinygrad takes no np.memmap); ACCESS_COPY: writable, as tinygrad's copies want, never written back
    return {name: {k: np.frombuffer(mm, np.dtype(dt), int(np.prod(shape)), off).reshape(shape) for k, (off, dt, shape) in planes.items()}
            for name, planes in idx["tensors"].items()}

  def begin(self):
    try:
      self.dir.mkdir(parents=True, exist_ok=True)
      self._out, self._tensors = AtomicFile(self.bin), {}  # 0644, as the database next to it
    except OSError as e: log.info(f"planes cache: cannot write in {self.dir} ({e.strerror or e}): not caching")

  def put(self, name: str, planes: dict[str, np.ndarray]):
    if self._out is None: return
    try:
      ent = {}
      out = self._out.file
      for k, v in planes.items():
        pos = out.tell()
        if pad := -pos % ALIGN: out.write(b"\0" * pad); pos += pad
        out.write(np.ascontiguousarray(v).data)
        ent[k] = (pos, v.dtype.str, list(v.shape))
      self._tensors[name] = ent
    except OSError as e: self._fail(e)

  def commit(self):
    if self._out is None: return
    try:
      size = self._out.file.tell()
      out, self._out = self._out, None
      out.commit()
      atomic_write(self.index, json.dumps({"ident": self.ident, "model": self.model, "bytes": size, "tensors": self._tensors}).encode())
      self._drop_stale()
      log.info(f"planes cache: wrote {self.bin} ({size / 2**20:.0f} MiB)")
    except OSError as e: self._fail(e)

  def _drop_stale(self):
    """Removes the planes of earlier versions of this model file: they can never match again."""
    for idx in self.dir.glob("planes-*.json"):
      if idx == self.index: continue
      try:
        if json.loads(idx.read_text()).get("model") != self.model: continue
        idx.unlink(); idx.with_suffix(".bin").unlink(missing_ok=True)
      except (OSError, ValueError): pass

  def _fail(self, e: OSError):
    log.info(f"planes cache: writing {self.dir} failed ({e.strerror or e}): not caching")
    if self._out is not None: self._out.abort()
    self._out = None

def _stack(each: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """The planes of matrices of one type stacked by rows (planes are per row), in one hostmem staging buffer."""
  out = hostmem.arrays({k: ((sum(e[k].shape[0] for e in each),) + p.shape[1:], p.dtype) for k, p in each[0].items()})
  for k, o in out.items(): np.concatenate([e[k] for e in each], out=o)
  return out

def load_weights(f: GGUFFile, cfg: ModelConfig, device: str, cache_dir=None, fuse: dict[str, list[str]] | None = None) -> dict:
  """Name -> QuantWeight (matrices) or float32 Tensor (vectors), on the device. fuse: fused name -> matrices of one
  type (model.fused_groups) uploaded as one QuantWeight, their rows stacked here on the host, in place of them."""
  out = {}
  fuse = fuse or {}
  member = {m: g for g, ms in fuse.items() for m in ms}
  # a fused weight is loaded where its first member would be
  names = [member.get(n, n) for n in cfg.tensor_shapes() if n not in member or fuse[member[n]][0] == n]
  t0, staged = time.monotonic(), dict(hostmem.stats)
  pc = PlanesCache(cache_dir, f, fuse) if cache_dir is not None else None
  cached = pc.read() if pc is not None else None
  if pc is not None and cached is None: pc.begin()
  # uploads from the planes cache (mapped pages, no staging) are realized together, up to UPLOAD_BATCH bytes at a
  # time: one scheduling for many copies (tinygrad's per-realize host work was most of a cached load)
  pending, pending_bytes = [], 0
  def flush():
    nonlocal pending, pending_bytes
    if pending: Tensor.realize(*pending)
    pending, pending_bytes = [], 0
  for n, name in enumerate(names):
    parts = [f.tensors[m] for m in fuse.get(name, [name])]
    info = parts[0]
    if len(info.shape) == 1:  # norms and rope factors: small, kept as float32
      raw = f.raw(name)
      vals = raw.reshape(-1).view(np.float32) if info.qtype == QT.F32 else gguf.quants.dequantize(np.asarray(raw).reshape(-1), info.qtype)
      out[name] = Tensor(np.array(vals, dtype=np.float32), device=device)
      pending.append(out[name])
    else:
      if cached is not None: planes = cached[name]
      else:
        each = [repack(f.raw(t.name), t.qtype, t.shape[0], t.shape[1]) for t in parts]
        planes = each[0] if len(each) == 1 else _stack(each)
      if pc is not None and cached is None: pc.put(name, planes)
      rows = [t.shape[0] for t in parts]
      out[name] = QuantWeight(info.qtype, sum(rows), info.shape[1], {k: Tensor(v, device=device) for k, v in planes.items()},
                              tuple(rows) if name in fuse else ())
      pending += out[name].planes.values()
      pending_bytes += sum(v.nbytes for v in planes.values())
    # repacked planes live in hostmem staging, one matrix at a time as hostmem's reservation assumes (README.md)
    if pending_bytes >= UPLOAD_BATCH or cached is None or n == len(names) - 1: flush()
    log.progress("loading weights" + (" (cached planes)" if cached is not None else ""), n + 1, len(names), t0)
  if pc is not None and cached is None: pc.commit()
  log.info(f"host staging: {hostmem.summary(staged)}")
  return out

def open_model(path) -> tuple[GGUFFile, ModelConfig]:
  f = GGUFFile(path)
  return f, config_from_gguf(f)
