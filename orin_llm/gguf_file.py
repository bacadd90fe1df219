"""Reading GGUF files: metadata and memory-mapped tensor data.

The format's constants, value types and quantization block sizes come from the `gguf` package.
The header is parsed here rather than with `gguf.GGUFReader`, which builds one numpy view per
string and takes ~8 s to open the Llama 3 vocabulary (280k merges); this parser reads the same
header in well under a second and is tested field for field against GGUFReader
(tests/test_errors.py, test_metadata_matches_gguf_reader). Tensor data is never copied: each tensor is a
view of one np.memmap.
"""
from __future__ import annotations
import mmap, os, pathlib, struct
from dataclasses import dataclass
from typing import Any
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from orin_llm.errors import OrinError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4         # ggml's GGML_MAX_DIMS
MAX_NESTING = 4      # arrays of arrays: real files have none; each level is a recursion of the parser
MAX_ELEMENTS = 1 << 62  # elements of one tensor (llama.cpp: its byte size must fit an int64)

_SCALAR = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
           GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
           GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
_NP = {GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
       GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4", GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "?",
       GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8"}

@dataclass(frozen=True)
class TensorInfo:
  name: str
  shape: tuple[int, ...]   # numpy order: (rows, cols) for a matrix, i.e. GGUF's dims reversed
  qtype: GGMLQuantizationType
  offset: int              # absolute byte offset in the file
  nbytes: int

_U64 = struct.Struct("<Q")

class _Cursor:
  def __init__(self, buf, path): self.buf, self.pos, self.path = buf, 0, path
  def take(self, n: int) -> memoryview:
    if self.pos + n > len(self.buf): raise OrinError(f"{self.path}: truncated GGUF file (header ends at byte {self.pos + n}, file has {len(self.buf)})")
    out = self.buf[self.pos:self.pos + n]; self.pos += n
    return out
  def unpack(self, fmt: str): return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
  def string(self) -> str:
    n = self.unpack("<Q")
    try: return str(self.take(n), "utf-8")
    except UnicodeDecodeError as e: raise OrinError(f"{self.path}: a metadata string is not valid UTF-8 at byte {self.pos - n}") from e
  def strings(self, n: int) -> list[str]:
    """n strings in one tight loop: a vocabulary's 128k tokens and 280k merges took 1.6 s through string()."""
    buf, pos, end, out, length = self.buf, self.pos, len(self.buf), [], _U64.unpack_from
    try:
      for _ in range(n):
        (k,) = length(buf, pos)
        pos += 8
        if pos + k > end: break
        out.append(str(buf[pos:pos + k], "utf-8"))
        pos += k
    except struct.error: pass  # the length itself runs past the end
    except UnicodeDecodeError as e: raise OrinError(f"{self.path}: a metadata string is not valid UTF-8 at byte {pos}") from e
    if len(out) < n: raise OrinError(f"{self.path}: truncated GGUF file (a string array runs past its end, {end} bytes)")
    self.pos = pos
    return out
  def value(self, vtype: int, depth: int = 0) -> Any:
    try: vtype = GGUFValueType(vtype)
    except ValueError: raise OrinError(f"{self.path}: unknown metadata value type {vtype} at byte {self.pos}") from None
    if vtype == GGUFValueType.STRING: return self.string()
    if vtype == GGUFValueType.ARRAY:
      if depth >= MAX_NESTING: raise OrinError(f"{self.path}: metadata arrays nested over {MAX_NESTING} deep at byte {self.pos}")
      sub, n = self.unpack("<I"), self.unpack("<Q")
      if sub in _NP:  # numeric arrays in one read
        dt = np.dtype(_NP[GGUFValueType(sub)])
        return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).tolist()
      if sub == GGUFValueType.STRING: return self.strings(n)
      # every element takes at least 4 bytes: a count past that is corrupt, refused before the loop
      if n > (len(self.buf) - self.pos) // 4: raise OrinError(f"{self.path}: truncated GGUF file (an array of {n} elements runs past its end)")
      return [self.value(sub, depth + 1) for _ in range(n)]
    return self.unpack(_SCALAR[vtype])

class GGUFFile:
  """An open GGUF file: `metadata` (dict), `tensors` (name -> TensorInfo), `raw(name)` (the tensor's bytes
  as uint8, shaped (rows, bytes per row): a read-only np.memmap view, never a copy)."""
  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    try: size = self.path.stat().st_size
    except OSError as e: raise OrinError(f"{path}: cannot open model file ({e.strerror})") from None
    if size < 24: raise OrinError(f"{path}: truncated GGUF file ({size} bytes)")
    with open(self.path, "rb") as f: self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(memoryview(self._mm), self.path)
    if (magic := bytes(cur.take(4))) != GGUF_MAGIC: raise OrinError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    self.version = cur.unpack("<I")
    if self.version not in SUPPORTED_VERSIONS: raise OrinError(f"{path}: unsupported GGUF version {self.version} (supported: 2, 3)")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    # a metadata entry takes at least 12 bytes, a tensor description 24: counts the file cannot hold are refused up front
    if n_kv > size // 12 or n_tensors > size // 24:
      raise OrinError(f"{path}: corrupt GGUF header ({n_tensors} tensors and {n_kv} metadata entries cannot fit in {size} bytes)")
    self.metadata: dict[str, Any] = {}
    for _ in range(n_kv):
      key = cur.string()
      self.metadata[key] = cur.value(cur.unpack("<I"))
    infos, seen = [], set()
    for _ in range(n_tensors):
      name, ndim = cur.string(), cur.unpack("<I")
      if not name.isprintable(): raise OrinError(f"{path}: a tensor name is not printable text: {name!r:.80}")  # errors quote names
      if ndim > MAX_DIMS: raise OrinError(f"{path}: tensor {name} has {ndim} dimensions (at most {MAX_DIMS})")
      if name in seen: raise OrinError(f"{path}: tensor {name} is described twice")
      seen.add(name)
      dims = tuple(cur.unpack("<Q") for _ in range(ndim))
      qt, off = cur.unpack("<I"), cur.unpack("<Q")
      try: qtype = GGMLQuantizationType(qt)
      except ValueError: raise OrinError(f"{path}: tensor {name} has unknown tensor type {qt}") from None
      if qtype not in GGML_QUANT_SIZES: raise OrinError(f"{path}: tensor {name} has tensor type {qtype.name}, which has no known block size")
      infos.append((name, dims, qtype, off))
    align = self.metadata.get("general.alignment", 32)
    # the spec's rule (llama.cpp's too): a power of two; 0 divided by zero below
    if not isinstance(align, int) or isinstance(align, bool) or align < 1 or align & (align - 1) or align > 1 << 30:
      raise OrinError(f"{path}: general.alignment must be a power of two, not {align!r:.40}")
    self.data_start = data_start = (cur.pos + align - 1) // align * align
    self.tensors: dict[str, TensorInfo] = {}
    for name, dims, qtype, off in infos:
      block, bsize = GGML_QUANT_SIZES[qtype]
      n = 1
      for d in dims: n *= d  # Python integers: numpy's int64 product wraps around silently
      if n > MAX_ELEMENTS: raise OrinError(f"{path}: tensor {name} has dimensions {list(dims)}, over 2^62 elements")
      if dims and dims[0] % block: raise OrinError(f"{path}: tensor {name} has rows of {dims[0]}, not a multiple of {qtype.name}'s block of {block}")
      if off % align: raise OrinError(f"{path}: tensor {name} starts at data offset {off}, not a multiple of the alignment {align}")
      nbytes = n // block * bsize
      if data_start + off + nbytes > size:
        raise OrinError(f"{path}: truncated GGUF file (tensor {name} needs bytes up to {data_start + off + nbytes}, file has {size})")
      self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), qtype, data_start + off, nbytes)
    self._np = np.memmap(self.path, dtype=np.uint8, mode="r")

  def raw(self, name: str) -> np.ndarray:
    """The tensor's bytes, shaped (rows, bytes per row): a view of the mapped file."""
    t = self.tensors[name]
    rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
    return self._np[t.offset:t.offset + t.nbytes].reshape(rows, t.nbytes // rows)

  def __contains__(self, name: str) -> bool: return name in self.tensors
  def close(self):
    self._np = None  # type: ignore[assignment]
    self._mm.close()
