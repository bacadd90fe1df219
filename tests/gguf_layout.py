"""Where each field of a GGUF header lies, for tests that alter one: a walk of the header that records the byte
position and struct format of every count, type, length, value and tensor description (it trusts the file)."""
import struct
from dataclasses import dataclass

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9

@dataclass
class Field:
  kind: str   # count, key, vtype, value, strlen, strbytes, subtype, arrcount, elems, ndim, dim, ttype, offset
  name: str   # the metadata key or tensor name it belongs to
  pos: int
  fmt: str    # struct format of a number; "" for raw bytes (strbytes, elems)
  size: int   # bytes

def walk(buf: bytes) -> tuple[list[Field], int]:
  """(fields, end of the tensor descriptions) of a well-formed header."""
  out, pos = [], 24
  out += [Field("count", "n_tensors", 8, "<Q", 8), Field("count", "n_kv", 16, "<Q", 8)]
  n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
  def string(name, kind="strbytes"):
    nonlocal pos
    n = struct.unpack_from("<Q", buf, pos)[0]
    out.append(Field("strlen", name, pos, "<Q", 8)); pos += 8
    s = buf[pos:pos + n].decode("utf-8", "replace")
    out.append(Field(kind, name, pos, "", n)); pos += n
    return s
  def value(name, vtype):
    nonlocal pos
    if vtype == STRING: string(name); return
    if vtype == ARRAY:
      sub, n = struct.unpack_from("<IQ", buf, pos)
      out.append(Field("subtype", name, pos, "<I", 4)); out.append(Field("arrcount", name, pos + 4, "<Q", 8)); pos += 12
      if sub in _SCALAR:
        size = struct.calcsize(_SCALAR[sub]) * n
        out.append(Field("elems", name, pos, "", size)); pos += size
      else:
        for i in range(n): value(f"{name}[{i}]", sub)
      return
    out.append(Field("value", name, pos, _SCALAR[vtype], struct.calcsize(_SCALAR[vtype]))); pos += struct.calcsize(_SCALAR[vtype])
  for _ in range(n_kv):
    key = string("key", "key")
    out[-2].name = out[-1].name = key
    vtype = struct.unpack_from("<I", buf, pos)[0]
    out.append(Field("vtype", key, pos, "<I", 4)); pos += 4
    value(key, vtype)
  for _ in range(n_tensors):
    name = string("tensor", "key")
    out[-2].name = out[-1].name = name
    ndim = struct.unpack_from("<I", buf, pos)[0]
    out.append(Field("ndim", name, pos, "<I", 4)); pos += 4
    for _ in range(ndim): out.append(Field("dim", name, pos, "<Q", 8)); pos += 8
    out.append(Field("ttype", name, pos, "<I", 4)); out.append(Field("offset", name, pos + 4, "<Q", 8)); pos += 12
  return out, pos

def find(fields: list[Field], kind: str, name: str, nth: int = 0) -> Field:
  return [f for f in fields if f.kind == kind and f.name == name][nth]

def put(buf: bytearray, f: Field, value):
  struct.pack_into(f.fmt, buf, f.pos, value)
