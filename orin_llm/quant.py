"""Quantized weights on the device: GGUF blocks repacked into planes of 32-bit words at load time,
and the tinygrad expressions that turn planes back into weights inside the consuming kernel.

Every supported type is an affine code per group of G consecutive elements of a row:
    w = scale * u + offset,   u an unsigned integer of B bits (B = 4, 5, 6 or 8)
GGUF interleaves u's bits, scales and super-block scales inside each block in a layout made for
hand-written kernels. We split them into planes, each a row-major array the kernel can read with
wide aligned loads (tinygrad never vectorizes uint8 loads, so bytes travel as uint32 words):
    q4   (O, I/8)  uint32: low 4 bits of u, element i in bits 4*(i%8) of word i//8
    qh1  (O, I/32) uint32: bit 4 of u (5-bit types), element i in bit i%32 of word i//32
    qh2  (O, I/8) uint16: bits 4-5 of u (Q6_K), element i in bits 2*(i%8) of unit i//8: one unit for each q4 word
         (little-endian, two units are the word of 16 codes that the kernels other than the tensor-core form read)
    q8   (O, I/4)  uint32: u = q + 128 (Q8_0), element i in byte i%4 of word i//4
    d, m, dmin     float16, one per block or super-block, exactly as stored in the file
    sc, mn         uint32: 8-bit sub-block scales and mins of the K-quants, four to a word
Nothing is rounded on the way: the kernel computes in float32 exactly what ggml dequantizes to,
and the planes take about the file's bytes (Q4_K/Q5_K: +3%, their 6-bit scales widened to 8).
"""
from __future__ import annotations
import functools, os
from dataclasses import dataclass
import numpy as np
from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
from tinygrad import Device, Tensor, dtypes
from orin_llm import hostmem
from orin_llm.errors import OrinError

SUPPORTED = (QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K)

# ---------------------------------------------------------------- host side: GGUF blocks -> planes

def _f16(blocks: np.ndarray, at: int) -> np.ndarray: return blocks[:, at:at+2].copy().view(np.float16)[:, 0]

def _pack(u: np.ndarray, bits: int) -> np.ndarray:
  """Packs unsigned values u (rows, n) of `bits` bits, 32//bits to a little-endian uint32 word."""
  per = 32 // bits
  u = u.reshape(u.shape[0], -1, per).astype(np.uint32) & np.uint32((1 << bits) - 1)
  return np.bitwise_or.reduce(u << (np.arange(per, dtype=np.uint32) * bits), axis=-1)

def _nibbles(qs: np.ndarray) -> np.ndarray:
  """(n, 16) bytes -> (n, 32) values: the 16 low nibbles, then the 16 high nibbles (ggml's Q4_0/Q4_1/Q5 order)."""
  return np.concatenate([qs & 0xF, qs >> 4], axis=-1)

def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The 12 scale bytes of a Q4_K/Q5_K block -> (sc, mn), eight 6-bit values each (ggml's get_scale_min_k4)."""
  sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=-1)
  mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=-1)
  return sc, mn

CHUNK = 4096  # blocks repacked at a time: the temporaries stay in the CPU's caches

def _nib_pairs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Bytes x (n, 2m) -> their low nibbles and their high nibbles, two to a byte in element order
  (n, m) each: 8 consecutive 4-bit values in a little-endian uint32, as _pack(u, 4) packs them."""
  a, b = x[:, 0::2], x[:, 1::2]
  return (a & 0xF) | (b << 4), (a >> 4) | (b & 0xF0)

# per block: (plane, words or halves, dtype), in the order the planes were first allocated (cache files keep it)
_U32, _U16, _F16 = np.uint32, np.uint16, np.float16
# Q6_K's 2-bit plane in 16-bit units, one a q4 word, rather than in 32-bit words, one for two q4 words. Read as words,
# its index is the q4 word's halved and its shift depends on the q4 word's parity; tinygrad's range simplifier merges
# no range whose merge adds a division or modulo, so a product's reduction stays split into (K/64 scale words, 4
# scales, 2 words, 8 nibbles) and a tensor core's 16-wide k axis can take only the scale words, 64 elements apart:
# each lane's code words loaded one by one, 128 bytes from its neighbour's, and each weight's scale computed again.
# The few-row tensor-core form of Q6_K then lost to one sum (docs/PERF.md, thirty-fifth to thirty-seventh sessions).
# Read as units, the reduction is (K/8 words, 8 nibbles), as Q4_K's, and the k axis takes 16 consecutive words
# (uint4 and ushort4 loads: tinygrad patch 0045). The other products read two units as the word they make
# (_high_bits): their kernels keep the layouts the patch series measured for them. Against the 32-bit plane (H200,
# BEAM=0, the 1B Q6_K file, docs/PERF.md, thirty-ninth session): its batch steps of 8 rows 3.45 -> 2.80 ms, of 2 rows
# 1.68 -> 1.62, of 4 rows 2.05 -> 2.08, decode 1.071 -> 1.072; its verify steps of 8 rows 3.44 -> 2.87 ms at depth 64.
_FAST_PLANES = {
  QT.Q8_0: (("d", 1, _F16), ("q8", 8, _U32)),
  QT.Q6_K: (("sc", 4, _U32), ("d", 1, _F16), ("q4", 32, _U32), ("qh2", 32, _U16)),
  QT.Q4_K: (("d", 1, _F16), ("dmin", 1, _F16), ("sc", 2, _U32), ("mn", 2, _U32), ("q4", 32, _U32)),
  QT.Q5_K: (("d", 1, _F16), ("dmin", 1, _F16), ("sc", 2, _U32), ("mn", 2, _U32), ("q4", 32, _U32), ("qh1", 8, _U32)),
}

def empty_planes(qtype: QT, rows: int, cols: int, device: str | None = None) -> dict[str, Tensor]:
  """Unfilled device planes of a (rows, cols) matrix of a fast-path type, as repack lays them out: for building a product's
  kernels without a model (scripts/mv_opts_bench.py, the patch series' tests)."""
  from tinygrad.dtype import _from_np_dtype
  block = GGML_QUANT_SIZES[qtype][0]
  return {n: Tensor.empty(rows, cols // block * w, dtype=_from_np_dtype(np.dtype(dt)), device=device) for n, w, dt in _FAST_PLANES[qtype]}

def _staging(n: int, spec) -> dict[str, np.ndarray]:
  """The planes of n blocks as views of one host buffer from hostmem (huge pages where there are some)."""
  return hostmem.arrays({name: ((n, width), dt) for name, width, dt in spec})

def _repack_fast(b: np.ndarray, qtype: QT, planes: dict):
  """Q4_K, Q5_K, Q6_K, Q8_0 built byte-wise from the blocks, CHUNK blocks at a time, into
  preallocated planes (hostmem staging): no uint32 per element, no full-size temporaries. Same output as the
  element-wise definition in tests/test_cache.py."""
  n = b.shape[0]
  out = _staging(n, _FAST_PLANES[qtype])
  if qtype == QT.Q8_0:
    d, q8 = out["d"], out["q8"]
    for i in range(0, n, CHUNK):
      c = b[i:i + CHUNK]
      d[i:i + CHUNK] = c[:, 0:2].view(np.float16)
      q8[i:i + CHUNK] = (c[:, 2:34] ^ np.uint8(0x80)).view(np.uint32)
  elif qtype == QT.Q6_K:
    sc, d, q4, qh2 = out["sc"], out["d"], out["q4"], out["qh2"]
    for i in range(0, n, CHUNK):
      c = b[i:i + CHUNK]; m = c.shape[0]
      ql = c[:, 0:128].reshape(m * 2, 64)  # per 128-element half: ql[0:32] low, ql[32:64] low, ql[0:32] high, ql[32:64] high
      lo0, hi0 = _nib_pairs(ql[:, :32]); lo1, hi1 = _nib_pairs(ql[:, 32:])
      q4[i:i + m] = np.concatenate([lo0, lo1, hi0, hi1], axis=1).reshape(m, 128).view(np.uint32)
      qh = c[:, 128:192].reshape(m * 2, 8, 4)  # element 32*s + l of a half takes bits 2s..2s+1 of qh[l]
      v = np.stack([(qh >> (2 * s)) & 3 for s in range(4)], axis=1)  # (2m, 4, 8, 4)
      # little-endian: the low 16 bits of a word of 16 codes are the unit of its first 8 (one q4 word's)
      qh2[i:i + m] = (v[..., 0] | (v[..., 1] << 2) | (v[..., 2] << 4) | (v[..., 3] << 6)).reshape(m, 64).view(qh2.dtype)
      sc[i:i + m] = (c[:, 192:208] ^ np.uint8(0x80)).view(np.uint32)
      d[i:i + m] = c[:, 208:210].view(np.float16)
  else:  # Q4_K, Q5_K
    d, dmin, sc, mn, q4 = out["d"], out["dmin"], out["sc"], out["mn"], out["q4"]
    if qtype == QT.Q5_K: qh1 = out["qh1"]
    at = 48 if qtype == QT.Q5_K else 16
    for i in range(0, n, CHUNK):
      c = b[i:i + CHUNK]; m = c.shape[0]
      d[i:i + m], dmin[i:i + m] = c[:, 0:2].view(np.float16), c[:, 2:4].view(np.float16)
      s, t = _k_scales(c[:, 4:16])
      sc[i:i + m], mn[i:i + m] = np.ascontiguousarray(s).view(np.uint32), np.ascontiguousarray(t).view(np.uint32)
      lo, hi = _nib_pairs(c[:, at:at + 128].reshape(m * 4, 32))  # four chunks of 64: 32 low nibbles, then 32 high
      q4[i:i + m] = np.concatenate([lo, hi], axis=1).reshape(m, 128).view(np.uint32)
      if qtype == QT.Q5_K:  # element 32*s + l takes bit s of qh[l]: bit s of each qh byte, 8 to a byte of qh1
        bits = np.unpackbits(c[:, 16:48, None], axis=2, bitorder="little")  # (m, 32 l, 8 s)
        qh1[i:i + m] = np.packbits(bits.transpose(0, 2, 1), axis=2, bitorder="little").reshape(m, 32).view(np.uint32)
  planes.update(out)

def repack(raw: np.ndarray, qtype: QT, rows: int, cols: int) -> dict[str, np.ndarray]:
  """raw: the tensor's bytes as stored in the GGUF file. Returns the planes (numpy, row-major)."""
  raw = np.asarray(raw)  # a plain view of the mapped file, not a np.memmap (tinygrad takes ndarrays)
  if qtype == QT.F32: return {"w": raw.reshape(-1).view(np.float32).reshape(rows, cols)}
  if qtype == QT.F16: return {"w": raw.reshape(-1).view(np.float16).reshape(rows, cols)}
  if qtype == QT.BF16: return {"w2": raw.reshape(-1).view(np.uint32).reshape(rows, cols // 2)}
  block, bsize = GGML_QUANT_SIZES[qtype]
  b = np.ascontiguousarray(raw).reshape(-1, bsize)  # one row of b per block, rows*cols/block of them
  planes: dict[str, np.ndarray] = {}
  if qtype in _FAST_PLANES:
    _repack_fast(b, qtype, planes)
    return {k: v.reshape(rows, -1) for k, v in planes.items()}  # views of the staging buffer: C-contiguous and writable
  if qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1):
    at = 4 if qtype in (QT.Q4_1, QT.Q5_1) else 2
    planes["d"] = _f16(b, 0)
    if at == 4: planes["m"] = _f16(b, 2)
    if qtype in (QT.Q5_0, QT.Q5_1):
      planes["qh1"] = b[:, at:at+4].copy().view(np.uint32)[:, 0]  # bit j of qh is element j's 5th bit
      at += 4
    u = _nibbles(b[:, at:at+16])
  else:
    raise ValueError(f"unsupported tensor type {qtype.name}")
  planes["q4"] = _pack(u, 4)  # Q5_0/Q5_1's qh1 already holds one word per 32-element block
  # tinygrad copies host arrays to the GPU from writable memory only: views of the mapped file are copied
  return {k: np.require(np.asarray(v).reshape(rows, -1), requirements=["C", "W"]) for k, v in planes.items()}

# ---------------------------------------------------------------- device side: planes -> weights

def _unpack(words: Tensor, bits: int, width: int = 32) -> Tensor:
  """(..., W) unsigned words of `width` bits -> (..., W*width/bits) values of `bits` bits, in element order."""
  per = width // bits
  shifts = Tensor.arange(per, dtype=dtypes.uint32) * bits
  return ((words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(*words.shape[:-1], words.shape[-1] * per)

def int_to_float(u: Tensor) -> Tensor:
  """Unsigned integers below 2**23 to float32, exactly: the bits of 2**23 + u are 0x4B000000 | u, so the
  conversion is an OR and a subtraction. A plain cast compiles to I2F, which NVIDIA GPUs run at a quarter
  of the FMA rate: on an H200 a 1B layer's four Q6_K matvecs timed alone took 14% less time this way, though
  the whole decode step only moved within noise (docs/PERF.md)."""
  return (u | 0x4B000000).bitcast(dtypes.float32) - 8388608.0

def _per_group(p: Tensor, group: int) -> Tensor:
  """(..., n) one value per group -> (..., n*group), each value repeated over its group."""
  return p.unsqueeze(-1).expand(*p.shape, group).reshape(*p.shape[:-1], p.shape[-1] * group)

# the types whose scale is one float16 per 32-element block -> the zero point subtracted from u
# (None: Q4_1 and Q5_1 add a float16 min per block instead)
_BLOCK32 = {QT.Q4_0: 8, QT.Q5_0: 16, QT.Q8_0: 128, QT.Q4_1: None, QT.Q5_1: None}

def _high_bits(qh2: Tensor, units: bool = False) -> Tensor:
  """Q6_K's bits 4-5 of every element from its qh2 plane of 16-bit units: read as units (the affine and tensor-core
  forms) or as the 32-bit words two units make (one sum: its kernels' index structure, and so their layouts, are those
  of the 32-bit plane the patch series measured; read as units, a few rows' one sum ran up to 1.5x slower)."""
  return _unpack(qh2.cast(dtypes.uint32), 2, 16) if units else _unpack(qh2.bitcast(dtypes.uint32), 2)

def _codes(planes: dict[str, Tensor], qtype: QT, units: bool = False) -> Tensor:
  """The unsigned integer code u of every element (..., I) of a quantized type's planes (units: _high_bits')."""
  u = _unpack(planes["q8"], 8) if qtype == QT.Q8_0 else _unpack(planes["q4"], 4)
  if "qh1" in planes: u = u | (_unpack(planes["qh1"], 1) << 4)
  if "qh2" in planes: u = u | (_high_bits(planes["qh2"], units) << 4)
  return u

def dequantize(planes: dict[str, Tensor], qtype: QT) -> Tensor:
  """The float32 weights (..., I) the planes encode, as a lazy tinygrad expression (fused into its consumer)."""
  if qtype == QT.F32: return planes["w"]
  if qtype == QT.F16: return planes["w"].cast(dtypes.float32)
  if qtype == QT.BF16:  # a bfloat16 is the top half of a float32
    w = planes["w2"]
    both = (w.unsqueeze(-1) << Tensor([16, 0], dtype=dtypes.uint32, device=w.device)) & 0xFFFF0000
    return both.bitcast(dtypes.float32).reshape(*w.shape[:-1], w.shape[-1] * 2)
  u = int_to_float(_codes(planes, qtype))
  d = planes["d"].cast(dtypes.float32)
  if qtype in _BLOCK32:
    if qtype in (QT.Q4_1, QT.Q5_1): return u * _per_group(d, 32) + _per_group(planes["m"].cast(dtypes.float32), 32)
    return (u - _BLOCK32[qtype]) * _per_group(d, 32)
  if qtype in (QT.Q4_K, QT.Q5_K):
    sc, mn = int_to_float(_unpack(planes["sc"], 8)), int_to_float(_unpack(planes["mn"], 8))
    scale, offset = _per_group(d, 8) * sc, _per_group(planes["dmin"].cast(dtypes.float32), 8) * mn
    return u * _per_group(scale, 32) - _per_group(offset, 32)
  if qtype == QT.Q6_K:
    scale = _per_group(d, 16) * (int_to_float(_unpack(planes["sc"], 8)) - 128)
    return (u - 32) * _per_group(scale, 16)
  raise ValueError(f"unsupported tensor type {qtype.name}")

_AFFINE_ZERO = {QT.Q8_0: 128, QT.Q4_0: 8, QT.Q5_0: 16, QT.Q6_K: 32}  # affine()'s zero points, subtracted from u

def half_codes(planes: dict[str, Tensor], qtype: QT) -> Tensor:
  """affine()'s u (the codes less their zero point) as float16, exactly: the bits of 1024 + u are 0x6400 | u for codes
  under 1024, so the conversion is an OR and a subtraction in float16, where affine()'s float32 u cast to float16
  costs a conversion instruction a weight (run at a fraction of the FMA rate, as int_to_float's note says of I2F)."""
  return (_codes(planes, qtype, units=True) | 0x6400).cast(dtypes.uint16).bitcast(dtypes.float16) - (1024.0 + _AFFINE_ZERO.get(qtype, 0))

def pair_codes(planes: dict[str, Tensor], qtype: QT) -> Tensor:
  """half_codes' values for the types of 4-bit words with at most Q6_K's 2-bit units (PAIR_TYPES), two to a 32-bit
  word: element j of a q4 word in its low half, element j + 4 in its high one, each made by one shift and one mask of
  the word (and of its unit) for both. So a q4 word gives (O, I) in the order [0, 4, 1, 5, 2, 6, 3, 7]; pair_order
  puts the input in that order. One element at a time, the form's kernels ran 5.5 (Q4_K) and 9.6 (Q6_K) instructions a
  weight in their inner loop, rendered for sm_90 and compiled by ptxas on the CPU (forty-first session, docs/PERF.md)."""
  q = planes["q4"].unsqueeze(-1)  # (O, W, 1)
  u = (q >> (Tensor.arange(4, dtype=dtypes.uint32) * 4)) & 0x000F000F
  if "qh2" in planes:  # element j's 2 bits at 2j of its unit, element j + 4's at 2j + 8: moved to 2j + 4 and 2j + 20
    h = planes["qh2"].cast(dtypes.uint32)
    h = ((h << 4) | (h << 12)).unsqueeze(-1)
    u = u | ((h >> (Tensor.arange(4, dtype=dtypes.uint32) * 2)) & 0x00300030)
  halves = (u | 0x64006400).bitcast(dtypes.float16)  # (O, W, 8): 1024 + the code, exactly (half_codes)
  return halves.reshape(*planes["q4"].shape[:-1], -1) - (1024.0 + _AFFINE_ZERO.get(qtype, 0))

def pair_order(x: Tensor) -> Tensor:
  """x (..., I) in pair_codes' order of the elements: [0, 4, 1, 5, 2, 6, 3, 7] in each 8."""
  return x.reshape(*x.shape[:-1], x.shape[-1] // 8, 2, 4).transpose(-1, -2).reshape(x.shape)

def affine(planes: dict[str, Tensor], qtype: QT) -> tuple[Tensor, Tensor, Tensor | None, int]:
  """The weights as w[o, g*G + j] = a[o, g] * u[o, g*G + j] + b[o, g]: (u as exact floats (O, I), a (O, I/G), b (O, I/G)
  or None, G). A zero point that is a multiple of the scale (Q6_K's 32, Q8_0's 128, Q4_0's 8, Q5_0's 16) is subtracted from
  u (exactly: int_to_float's subtraction takes it) and b is None; the K-quants' and Q4_1/Q5_1's own minimum stays in b."""
  zero = _AFFINE_ZERO.get(qtype, 0)
  # (Q6_K's 2-bit plane read as units: the groups are axes of their own here, so the units change no range; read as words,
  # each word was put together from its two units, ~2% of the 1B's decode step: docs/PERF.md, thirty-ninth session)
  u = (_codes(planes, qtype, units=True) | 0x4B000000).bitcast(dtypes.float32) - (8388608.0 + zero)  # int_to_float, the zero point in its subtraction
  d = planes["d"].cast(dtypes.float32)
  if qtype in _BLOCK32: return u, d, (planes["m"].cast(dtypes.float32) if "m" in planes else None), 32
  if qtype in (QT.Q4_K, QT.Q5_K):
    sc, mn = int_to_float(_unpack(planes["sc"], 8)), int_to_float(_unpack(planes["mn"], 8))
    return u, _per_group(d, 8) * sc, -(_per_group(planes["dmin"].cast(dtypes.float32), 8) * mn), 32
  if qtype == QT.Q6_K: return u, _per_group(d, 16) * (int_to_float(_unpack(planes["sc"], 8)) - 128), None, 16
  raise ValueError(f"no affine form for {qtype.name}")

def count_knob(name: str, default: int, most: int, env=os.environ) -> int:
  """An experiment's count knob from the environment: a whole number from 0 to most, else a one-line OrinError."""
  raw = env.get(name, str(default)).strip()
  if not raw.isdigit() or int(raw) > most:
    raise OrinError(f"{name}={raw!r}: a whole number from 0 to {most} is needed (default {default})")
  return int(raw)

# A single row's product (decode; a few rows with AFFINE_ROWS) in the affine form: each group's scale taken out of its
# sum, so that an element costs an int-to-float and one multiply-add rather than two multiply-adds (tinygrad patches 0039
# and 0040 lay the nested sums out). Measured on an H200 at BEAM=0 against one sum (docs/PERF.md, twenty-seventh and twenty-eighth sessions):
# - the 1B Q6_K file: decode 763 -> 866 tok/s at depth 0 (+13.5%), 673 -> 752 at 4096 (+11.7%), the same greedy tokens;
#   alone with a cold L2, the 1B's gate+up 30.9-37.7 -> 28.2-32.4 us, its ffn_down 30.1 -> 27.8;
# - the 8B Q4_K_M file, its Q6_K products in this form (model.Fused giving a lone one its own kernel): 181.5 -> 188.7 at
#   depth 0; its Q4_K products too: 187.9 -> 227.9 (+21%), 174.5 -> 209.2 at 4096 (+20%); the 1B Q4_K_M: 752 -> 886
#   (+18%), 661 -> 762 (+15%);
# - Qwen3-0.6B Q8_0: 757 -> 828 (+9%), 619 -> 668 at 4096 (+8%).
# The types that take it by default: those measured. Q4_0 and Q5_0 fold their zero point into the int-to-float as Q8_0
# does, Q5_K, Q4_1 and Q5_1 keep a minimum of their own as Q4_K does (each group's sum of the input, summed inside the
# product's kernel: patch 0040); all are exact on the CPU, none is measured on a GPU.
AFFINE_DEFAULT = (QT.Q6_K, QT.Q4_K, QT.Q8_0)
AFFINE_ABLE = (*_BLOCK32, QT.Q4_K, QT.Q5_K, QT.Q6_K)  # the types affine() writes
# ORIN_LLM_AFFINE: 1 (the default types), 0 (off) or the types by name ("Q6_K,Q4_K"), part of the steps file's key as in
# effect. The few-row products (batches, verify steps) keep one sum unless ORIN_LLM_AFFINE_ROWS (below) says otherwise:
# patch 0038's layouts were measured for it.
def affine_types(env=os.environ) -> tuple[QT, ...]:
  """The types whose single-row products run in the affine form, from ORIN_LLM_AFFINE."""
  raw = env.get("ORIN_LLM_AFFINE", "1").strip()
  if raw == "1": return AFFINE_DEFAULT
  if raw == "0": return ()
  names = [n.strip().upper() for n in raw.split(",") if n.strip()]
  able = {t.name: t for t in AFFINE_ABLE}
  if not names or any(n not in able for n in names):
    raise OrinError(f"ORIN_LLM_AFFINE={raw!r}: 1 (the default types, {', '.join(t.name for t in AFFINE_DEFAULT)}), 0 (off) "
                    f"or some of {', '.join(able)} separated by commas is needed")
  return tuple(dict.fromkeys(able[n] for n in names))
AFFINE = affine_types()

# ORIN_LLM_AFFINE_ROWS: the most input rows a product takes in the affine form (1, the default: decode's single row;
# up to 8: a batch step's rows, a verify step's of up to 8, and any prefill chunk or group step of as few). Patches
# 0039/0040 lay out at most tinygrad's MV_MAX_ROWS (8 unless set lower) input rows; past it such a product runs one
# thread a weight row (slow, not wrong). Per element the form saves one multiply-add of the rows' (rows + ~3), yet
# alone on an H200 (docs/PERF.md, twenty-ninth session) its layout took 1.2-2.4x one sum's (patch 0038): the 1B's
# gate+up (Q6_K), 4 rows: 43.8 against 37.7 us; the 8B's (Q4_K), 4 rows: 148-154 against 90-102; 8 rows: 278 against
# 115. So 1 by default. Part of the steps file's key.
AFFINE_MAX_ROWS = 8
def affine_rows(env=os.environ) -> int:
  """ORIN_LLM_AFFINE_ROWS: 1 (default) to AFFINE_MAX_ROWS."""
  raw = env.get("ORIN_LLM_AFFINE_ROWS", "1").strip()
  if not raw.isdigit() or not 1 <= int(raw) <= AFFINE_MAX_ROWS:
    raise OrinError(f"ORIN_LLM_AFFINE_ROWS={raw!r}: a number of input rows from 1 (the default) to {AFFINE_MAX_ROWS} is needed")
  return int(raw)
AFFINE_ROWS = affine_rows()

def affine_product(x: Tensor, planes: dict[str, Tensor], qtype: QT) -> Tensor:
  """x (T, I) @ W.T with W's scale taken out of the sum over each group: per element an int-to-float and one
  multiply-add, per group a multiply by a (and, with a minimum, b times the group's sum of x)."""
  u, a, b, G = affine(planes, qtype)
  O, I = u.shape
  xg = x.reshape(x.shape[0], 1, I // G, G)
  out = (xg * u.reshape(1, O, I // G, G)).sum(-1) * a
  # each group's sum of x taken per weight row (expanded): a sum inside the product's kernel, next to the loads it
  # shares (tinygrad patch 0040). Of x alone, tinygrad gave it a small kernel of its own for every input
  if b is not None: out = out + xg.expand(x.shape[0], O, I // G, G).sum(-1) * b
  return out.sum(-1)

# ORIN_LLM_AFFINE_MANTISSA=1 (an experiment's knob, off by default; part of the steps file's key): affine_product of the
# 4-bit types with each code made the float 1 + code / 16 (mantissa_codes: its bits shifted once to the top of 1.0's
# mantissa, one mask, one OR) rather than int_to_float's code (a shift, a mask, an OR, then a subtraction of 2^23 a
# code); the sum then subtracts (16 + zero) times the group's sum of x once a group. Rendered for sm_90 and compiled by
# ptxas on the CPU (the 8B's decode step, forty-first session, docs/PERF.md): the main loop of its Q4_K products 453 ->
# 418 instructions (gate+up, Q+K+V), 406 -> 364 (ffn_down). Q6_K (6 bits at 17..22: 331 -> 340 in attn_v) and Q8_0
# (416 -> 440) did not gain and keep int_to_float. Exact codes; the sums' rounding ~1e-6 of the output's scale against
# ~1e-7. Not yet timed on a GPU.
AFFINE_MANTISSA = count_knob("ORIN_LLM_AFFINE_MANTISSA", 0, 1)
# type -> (plane, bits a code there, where its lowest bit goes in the float) for each plane of its code, and the code's
# bits. Any type of codes in planes of 16- or 32-bit units fits (Q6_K: (("q4", 4, 17), ("qh2", 2, 21)), 6; Q8_0:
# (("q8", 8, 15),), 8); these are the types it took instructions out of.
MANTISSA_TYPES = {QT.Q4_K: ((("q4", 4, 19),), 4), QT.Q4_0: ((("q4", 4, 19),), 4), QT.Q4_1: ((("q4", 4, 19),), 4)}

def _to_mantissa(words: Tensor, bits: int, at: int) -> Tensor:
  """(..., W) unsigned words of codes of `bits` bits (code j at bit bits*j) -> (..., W * per) uint32, each code at bits
  at .. at + bits - 1 and nothing else: one shift (left or right, by a constant) and one mask a code."""
  per = (32 if words.dtype == dtypes.uint32 else 16) // bits
  w = words.cast(dtypes.uint32) if words.dtype != dtypes.uint32 else words
  moved = [(w << (at - bits * j)) if at >= bits * j else (w >> (bits * j - at)) for j in range(per)]
  return (Tensor.stack(*moved, dim=-1) & (((1 << bits) - 1) << at)).reshape(*words.shape[:-1], words.shape[-1] * per)

def mantissa_codes(planes: dict[str, Tensor], qtype: QT) -> tuple[Tensor, int]:
  """(1 + code / 2^bits as float32 (..., I), exactly, bits): the code's bits at the top of the mantissa of 1.0."""
  spec, bits = MANTISSA_TYPES[qtype]
  c = functools.reduce(lambda a, b: a | b, [_to_mantissa(planes[name], b, at) for name, b, at in spec])
  return (c | 0x3F800000).bitcast(dtypes.float32), bits

def mantissa_product(x: Tensor, planes: dict[str, Tensor], qtype: QT) -> Tensor:
  """affine_product's x (T, I) @ W.T from mantissa_codes' f = 1 + code / 2^bits: with u = code - zero = 2^bits (f - 1) - zero,
  each group's sum of x * u is 2^bits * sum(x * f) - (2^bits + zero) * sum(x)."""
  _, a, b, G = affine(planes, qtype)
  f, bits = mantissa_codes(planes, qtype)
  O, I = f.shape
  xg = x.reshape(x.shape[0], 1, I // G, G)
  sf = (xg * f.reshape(1, O, I // G, G)).sum(-1)
  sx = xg.expand(x.shape[0], O, I // G, G).sum(-1)  # (inside the product's kernel, as affine_product's: patch 0040)
  off = -a * float((1 << bits) + _AFFINE_ZERO.get(qtype, 0))
  return (sf * (a * float(1 << bits)) + sx * (off if b is None else off + b)).sum(-1)

# rows of input from which a weight is applied as a float16 matrix product on tensor cores rather than dequantized
# inside the reduction (QuantWeight.__call__). A chunk of 32 rows took 12.8 ms dequantizing inside, 6.2 ms as
# matrices (H100, 1B Q6_K, docs/PERF.md, sixth session); decode and verify rows (at most 16) stay below it
MATMUL_ROWS = 32

# ORIN_LLM_TC_ROWS (default 4; 0 turns it off; part of the steps file's key): products of at least this many input rows
# (and their type's own floor in TC_TYPES) and fewer than MATMUL_ROWS (batch and verify steps), of a matrix of at least
# TC_MIN_WEIGHTS weights, take the fused tensor-core form (tc_product): each weight dequantized in float16 inside the
# product's kernel, multiplied with the rows on tensor cores (mma.m16n8k16: 16 weight rows by 8 input rows), each weight
# word read once for all rows.
# One sum's kernel (patch 0038's layouts) for 8 rows takes 2.2x a single row's in the affine form (the 8B's gate+up: 115
# against 51 us alone; docs/PERF.md, twenty-ninth session); issue 20's verify steps want at most 1.3x. Measured at
# BEAM=0 on an H200 (docs/PERF.md, thirty-fifth and thirty-sixth sessions), off -> on: verify of 4 / 8 rows, the 8B
# Q4_K_M 10.06 -> 8.43 / 14.68 -> 11.41 ms and the 3B 6.37 -> 5.61 / 8.96 -> 7.09 (one run each); the 1B Q4_K_M, with
# the floor below, 2.30 -> 2.18 / 3.70 -> 3.28 ms (means of two alternated runs); the 3B's server with 4 clients 693 ->
# 847 tok/s aggregate, one client unchanged (412 -> 410; one run each). Not measured on the Orin.
def tc_rows(env=os.environ) -> int:
  """ORIN_LLM_TC_ROWS: 4 (the default), 0 (off) or a number of input rows from 2 to MATMUL_ROWS - 1."""
  raw = env.get("ORIN_LLM_TC_ROWS", "4").strip()
  if not raw.isdigit() or not (int(raw) == 0 or 2 <= int(raw) < MATMUL_ROWS):
    raise OrinError(f"ORIN_LLM_TC_ROWS={raw!r}: 4 (the default), 0 (off) or a number of input rows from 2 to "
                    f"{MATMUL_ROWS - 1} is needed")
  return int(raw)
TC_ROWS = tc_rows()
def tc_opt_level(rows: int) -> None:
  """The tensor-core opt level tinygrad's hand-coded opts use (its TC_OPT), raised to 2 where the form is on: the form's
  product has several reduce axes (level 1) and fewer than 8 input rows pads the tensor core's 8-wide side (level 2).
  Tied to the knob so that the steps file's key (which holds ORIN_LLM_TC_ROWS) names the opts too; on by default, so
  every kernel of a process is optimized at level 2. The other kernels of the 1B's decode, verify (4, 8 rows), batch
  (4) and chunk steps render the same at level 2 as at 0 (sm_90, CPU, thirty-fifth session)."""
  from tinygrad.helpers import TC_OPT
  if rows: TC_OPT.value = max(TC_OPT.value, 2)
tc_opt_level(TC_ROWS)
# the smallest matrix (weights) whose product takes the form. Its warps each take 64 weight rows of one part of the
# reduction (tc_parts), so a small matrix leaves most of the GPU idle. In parts of 1024 (before TC_WARPS), Q4_K shapes
# alone, 4 / 8 rows, the form's time over one sum's (H200, docs/PERF.md, thirty-sixth session): lost at 2048x2048 (64
# warps: 1.45x / 1.1x) and 2560x2048 (80 warps: 1.1-1.4x / 1.2-1.3x), tied or won at 3072x3072 (144 warps: 1.0x /
# 0.93x), 4096x3072 (192: 0.72x / 0.80x), 2048x8192 (256: 0.67x / 0.64x) and 16384x2048 (512: 0.8x / 0.55x). With
# TC_WARPS' parts the floor went from 1 << 23 to 1 << 22 (the 8B's attn_v, the 1B's attn_output and Q+K+V take the form;
# measured in the steps only, with TC_WARPS). Measured on an H200's 132 SMs; the Orin has 16, so its floor may lie lower
# (unmeasured). ORIN_LLM_TC_MIN_WEIGHTS: an experiment's knob (part of the steps file's key).
TC_MIN_WEIGHTS = count_knob("ORIN_LLM_TC_MIN_WEIGHTS", 1 << 22, 1 << 40)
def has_tensor_cores(device) -> bool:
  """Whether tinygrad's renderer for the device has tensor cores: the form is for them. Elsewhere (tinygrad's CPU
  backend) a few rows keep one sum, as decode's."""
  return isinstance(device, str) and _renderer_has_tensor_cores(device)
@functools.cache
def _renderer_has_tensor_cores(device: str) -> bool:
  return bool(Device[device].renderer.tensor_cores)
# ORIN_LLM_TC_PAIRS (default 1; 0 gives half_codes' one code a 16-bit unit; part of the steps file's key): the form's
# codes two to a 32-bit word (pair_codes). Rendered for sm_90 and compiled by ptxas on the CPU, with patch 0046, the 8B's
# ffn_down (4096 x 14336, 8 rows) runs 40% fewer instructions a thread in Q6_K (2527 -> 1574 an outer step of 32 mma)
# and 19% fewer in Q4_K (1464 -> 1183); the form's products are bound by their instructions, not their bytes. Timed on
# an H200 at BEAM=0 (docs/PERF.md, forty-second session), alternated with 0 in one call: the 8B Q4_K_M's verify step of
# 8 rows 6.65-6.71 -> 5.72-5.75 ms (1.39-1.43x -> 1.17-1.21x its decode step), of 4 rows 6.30-6.39 -> 6.00-6.29; the
# 1B Q6_K's 8-row batch step 2.317 -> 2.113 ms.
TC_PAIRS = count_knob("ORIN_LLM_TC_PAIRS", 1, 1)
PAIR_TYPES = (QT.Q4_K, QT.Q6_K, QT.Q4_0, QT.Q4_1)  # q4 words, and Q6_K's units: no qh1 (Q5_K, Q5_0, Q5_1), no q8
# the types whose products take that form, each from how many rows (at least TC_ROWS). Q4_K's beat one sum alone (8B
# shapes, 4 and 8 rows: 0.60-0.88x its time; H200, thirty-fifth session, docs/PERF.md). Q6_K's lost (1.18-2.25x: 8B and
# 1B shapes, 4 and 8 rows; still after half_codes, and with the tensor core's k on the nibbles: thirty-fifth to
# thirty-seventh sessions) until its 2-bit plane came in 16-bit units (above), alone on an H200 (thirty-ninth
# session): 8 rows, the 1B's gate+up 60.4 -> 46.5 us, its output head 286 -> 185, the 8B's ffn_down 91.6 -> 73.8, its
# output head 715 -> 327; 4 rows it still lost (the 1B's gate+up 37.8 -> 51.3, ffn_down 34.5 -> 43.3), hence 8. With
# its codes in pairs (TC_PAIRS) it wins at 4 rows too: the 1B Q6_K's 4-row batch step 2.078 -> 1.737 ms with the
# form from 4 rows (H200, BEAM=0, forty-second session; the 8B's 4-row verify step with it is unmeasured). The other
# types are unmeasured.
TC_TYPES = {QT.Q4_K: 0, QT.Q6_K: 4 if TC_PAIRS else 8}

def takes_tc(qtype: QT, rows, weights: int, device) -> bool:
  """Whether a product of this many input rows (an int: a step's constant) over a matrix of this type and size takes
  tc_product's form."""
  return bool(TC_ROWS) and isinstance(rows, int) and qtype in TC_TYPES and rows >= max(TC_ROWS, TC_TYPES[qtype]) and \
    weights >= TC_MIN_WEIGHTS and has_tensor_cores(device)

# A prefill chunk of at most TC_CHUNK_ROWS rows (as_matrix: the small chunk of short prompts and of a prompt's tail)
# whose matrix has no float16 copy (prefill_copy_mb too small for the model: on an H100 at the default 8192 MiB the 8B
# Q4_K_M's 13 GB of copies) takes tc_product's form, reading the planes once, in place of dequantizing every matrix into
# a float16 scratch before its product. The 1B Q6_K with `--prefill-copy-mb 0`, pp32 6215 -> 9335 tok/s (first token
# 5.1 -> 3.4 ms; with its copies kept ~2.4 ms a chunk), decode unchanged (H100, BEAM=0, one process each, forty-eighth
# session, docs/PERF.md). The 8B Q4_K_M's pp32 1098 -> 2147 tok/s (first token 29.1 -> 14.9 ms; llama.cpp FA=1 2900;
# forty-ninth session). Larger chunks (512, several prompts together) keep the scratch, whose cost is shared by their
# rows: the 8B's pp512 with the form for 512-row chunks was 3187 tok/s against the scratch's 7345 (same call). ORIN_LLM_TC_CHUNK_ROWS=n (0: every chunk the scratch's way; part of the steps file's key).
TC_CHUNK_ROWS = count_knob("ORIN_LLM_TC_CHUNK_ROWS", MATMUL_ROWS, 1 << 16)

def tc_product(x: Tensor, planes: dict[str, Tensor], qtype: QT, members: tuple[int, ...] = ()) -> Tensor | list[Tensor]:
  """x (T, I) @ W.T in one kernel that tensor cores can take: W in float16, computed from its pieces cast to float16
  (u*a + b). The pieces, not the dequantized float32 W, are cast: a cast of W (an elementwise node between the rows'
  broadcast and a computation reading more than 3 buffers) made tinygrad write W to memory in a kernel of its own
  (rangeify realizes such a node, and inlines it again only when it reads at most 3 buffers); each piece reads 2.
  W is the multiply's first operand, so that tinygrad puts its rows on the tensor core's 16-wide side and the input's
  on the 8-wide one. Rounding: a and b once each to float16, then their product and sum in float16 (the prefill's
  float16 copies round W once); sums in float32. A group scale under float16's normal range (~6e-5: weights under
  ~1e-3) keeps fewer bits than W's own rounding would.
  members (the row counts of the matrices W stacks, QuantWeight.splits): the list of their products, each member's
  parts summed apart (SPLIT_SUMS)."""
  u, a, b, G = affine(planes, qtype)
  (O, I), T, S = u.shape, x.shape[0], tc_parts(u.shape[1], u.shape[0])
  # the reduction in S parts side by side (S times the warps: a warp takes 64 weight rows, TC_ROWS_A_WARP, and the 1B's
  # Q/K/V has 48 such tiles), their float32 sums added by a small kernel. Each piece is reshaped into the parts before they are
  # combined: a reshape of the combined W (four buffers) between it and the rows' broadcast is realized as W was
  part = lambda t: t.reshape(O, S, I // S)
  pairs = TC_PAIRS and qtype in PAIR_TYPES
  w = part(pair_codes(planes, qtype) if pairs else half_codes(planes, qtype)) * part(_per_group(a.cast(dtypes.float16), G))
  if b is not None: w = w + part(_per_group(b.cast(dtypes.float16), G))
  # x in float16 written once by a small kernel: each warp's tile reads all of it, and inlined its computation ran in
  # every tile (the 8B's attn_output, whose x is the attention's output in a padded view, got a reduction padded to
  # 16 from 8, half its lanes idle: 80 us in the step where one sum took 36; H200, thirty-fifth session). So too a norm's
  # output (x * w / rms computed in the tiles of Q+K+V, gate+up and the head, 2 kernels a layer fewer): the 8B Q4_K_M's
  # verify4 / verify8 at depth 64 5.39-5.46 -> 6.00-6.10 / 5.83-5.84 -> 7.80-7.91 ms (H100, BEAM=0, fifty-second session)
  x16 = pair_order(x.cast(dtypes.float16)) if pairs else x.cast(dtypes.float16)  # (the groups' scales are in whole words)
  y = (w * x16.contiguous().reshape(T, 1, S, I // S)).sum(-1, dtype=dtypes.float32)  # (T, O, S)
  if S > 1 and members: return [m.sum(-1) for m in y.contiguous().split(list(members), dim=1)]  # each member's parts apart
  y = y.reshape(T, O) if S == 1 else y.contiguous().sum(-1)
  return y.split(list(members), dim=-1) if members else y

# The parts' sums of a fused weight's members apart (model.Fused's apart: gate+up). Summed whole, gate+up's parts took a
# kernel of their own before SiLU(gate) * up: tinygrad realizes a sum whose output is read through slices. Summed apart,
# each member's sum is one more reduction in the kernel that reads it (rendered for sm_90: the 8B's 8-row gate+up parts'
# sum and SiLU * up, r_1792_32_4_4 and E_8_112_16_4_2, one kernel r_8_112_16_4_2_4_4; 4 rows: the same). Measured at
# BEAM=0 on H100s, each setting in its own processes, alternated (docs/PERF.md, fiftieth session): the 1B Q6_K's batch
# step of 4 rows 1.569-1.572 -> 1.554-1.556 ms, of 8 rows 1.693-1.696 -> 1.670-1.675 (two processes each, 319 graph
# nodes against 335); the 8B Q4_K_M's verify8 at depth 64 unchanged (5.81-5.94 ms against 5.84-5.92, four and three
# processes on one machine). ORIN_LLM_SPLIT_SUMS=0 (an experiment's knob; part of the steps file's key): summed whole
def split_sums(env=os.environ) -> int:
  """ORIN_LLM_SPLIT_SUMS: 1 (the default: gate+up's members summed apart) or 0."""
  return count_knob("ORIN_LLM_SPLIT_SUMS", 1, 1, env)
SPLIT_SUMS = split_sums()

# tc_product's parts: each at least TC_PART_LEN long, so that the parts' float32 sums (4 bytes a row and weight row a
# part) stay a few percent of the weights' bytes (~0.56 a weight for Q4_K): 8 rows, Q4_K, parts of 1024: 5.6%
TC_PART_LEN = 1024
# ... unless the matrix has too few weight rows to give the GPU TC_WARPS warps that way (a warp takes 64 weight rows of
# one part: tinygrad's hand-coded UPCAST 0 4): then more parts, down to 256 long (a K-quant block),
# while the warps stay within TC_WARPS (below). In parts of 1024 the
# 8B's attn_output (4096 x 4096) had 256 warps and its attn_v 64 (so it stayed under TC_MIN_WEIGHTS, in one sum: 31 us
# a layer for 8 rows against decode's 5.6). Measured at BEAM=0 on an H200 (docs/PERF.md, fortieth session), with
# TC_MIN_WEIGHTS lowered from 1 << 23 to 1 << 22 in the same change: the 8B Q4_K_M's verify steps of 4 / 8 rows 6.85 ->
# 6.11 / 7.01 -> 6.50 ms; the 1B Q6_K's 8-row batch step 2.808 -> 2.498 ms (4 rows: Q6_K takes the form from 8).
# ORIN_LLM_TC_WARPS (an experiment's knob; part of the steps file's key): 0 gives parts of TC_PART_LEN only.
# A ceiling, not a target: the split stops where one more step would pass it. As a target (split until the warps reach
# it) 1024 made the 1B Q6_K's batch steps faster (its gate+up 512 -> 1024 warps in parts of 512, its ffn_down 512 ->
# 1024 in parts of 256) and the 8B's verify8 slower: +0.45-0.64 ms, its ffn_down 896 -> 1792 warps alone +0.30-0.56 (H100,
# BEAM=0, fifty-second session; the forty-first's +0.47 on an H200). As a ceiling the 8B's ffn_down (896) and Q+K+V
# (768) stay, its attn_output goes 512 -> 1024 warps. Against the target of 512 before it (H100, BEAM=0, alternated
# processes, fifty-second session): the 1B's batch steps of 4 rows 1.541-1.545 -> 1.443-1.445 ms, of 8 rows 1.653-1.654
# -> 1.593; the 8B's verify8 at depth 64 5.79-5.96 -> 5.82-6.00 ms, at 4000 6.82-6.97 -> 6.76-6.96 (three processes each:
# unchanged), verify4 5.48-5.57 -> 5.37-5.49. The seeds' other shapes: the 3B's gate and gate+up go to 768 / 1024
# warps, Qwen3's are unchanged (tests/test_tc_rows.py). (ORIN_LLM_TC_WARPS=512 is not the old target's split: the 8B's
# Q+K+V would take 384 warps where the target gave 768.)
TC_WARPS = count_knob("ORIN_LLM_TC_WARPS", 1024, 1 << 20)
TC_ROWS_A_WARP = 64
def tc_parts(cols: int, rows: int) -> int:
  """The parts tc_product splits a reduction of cols into: the most that divide it into whole 256-blocks (a K-quant
  block) and are at least as many as parts of TC_PART_LEN make, while rows // TC_ROWS_A_WARP (the warps' tiles) times
  the parts stays within TC_WARPS; the parts of TC_PART_LEN where even they pass it."""
  ok = [s for s in range(1, cols // 256 + 1) if cols % s == 0 and (cols // s) % 256 == 0]
  base = max([s for s in ok if cols // s >= TC_PART_LEN] or [1])
  tiles = max(rows // TC_ROWS_A_WARP, 1)  # (a matrix under 64 rows: the CPU tests' small ones)
  return max([s for s in ok if s >= base and tiles * s <= TC_WARPS] or [base])
# A matrix product's output tiles each walk the whole reduction in turn; with few rows there are few tiles: the 32-row
# chunk's products ran at 125-820 GB/s of weights after a full search (ffn_down, 8192 long: 155 us a layer; H200, 1B
# Q6_K, eighteenth session, docs/PERF.md). So the reduction is split into parts, multiplied side by side (one more
# axis of tiles) into float32 partial sums that a small kernel adds. A part is at least 4 x rows long, so that the
# partial sums (4 bytes a row and output) take at most half the bytes of the float16 weights (2 a column and output),
# and at least SPLIT_LEN. Measured (H200, 1B Q6_K, same call as llama.cpp): pp32 4599 -> 9414 tok/s with parts of 256
# (8862 with 128, 8462 with 512); pp512 32227 -> 35369 and pp2048 29489 -> 32102 with ffn_down's 8192 in 4 parts of
# 2048 (its product 274 -> 163 us searched, plus 17 us for the sum), the 2048-long products whole.
# ORIN_LLM_CHUNK_SPLIT=n (an experiment's knob; part of the steps file's key): SPLIT_LEN, 0: no split
def chunk_split(env=os.environ) -> int:
  """ORIN_LLM_CHUNK_SPLIT: 0 (no split) or a multiple of 16 up to 65536 (default 256)."""
  raw = env.get("ORIN_LLM_CHUNK_SPLIT", "256")
  if not raw.strip().isdigit() or int(raw) % 16 or int(raw) > 65536:
    raise OrinError(f"ORIN_LLM_CHUNK_SPLIT={raw!r}: 0 or a multiple of 16 up to 65536 is needed (default 256)")
  return int(raw)
SPLIT_LEN = chunk_split()

def split_parts(rows: int, cols: int) -> int:
  """Parts the reduction of a matrix product of `rows` input rows over `cols` columns runs in (1: not split)."""
  part = max(SPLIT_LEN, 4 * rows)
  if not SPLIT_LEN or cols % part or cols <= part: return 1
  return cols // part

# Float16 copies for prefill (Engine's prefill_copy_mb): every layer's matrix kept on the device as float16 too, beside
# its planes, so that a prefill chunk multiplies that copy rather than dequantizing each matrix into a scratch first. A
# chunk then reads 2 bytes a weight, where it wrote 2 and read 2 more after reading the planes. Measured on an H200 (1B
# Q6_K, twenty-fourth session, docs/PERF.md): pp32 +34%, pp512 +8%, pp2048 +7%, the first token after 32 prompt tokens
# 2.9 -> 2.2 ms, decode unchanged; on the Orin's 204.8 GB/s the dequantizations cost ~14 ms a 1B chunk. It costs 2 bytes
# a weight of device memory (1B: 1.8 GiB; 8B: 14 GiB), hence the bound.
DEFAULT_PREFILL_COPY_MB = 8192

def layer_matrices(weights: dict) -> list:
  """The layers' matrices (blk.*), those prefill keeps float16 copies of (QuantWeight.keep_dense)."""
  return [w for n, w in weights.items() if n.startswith("blk.") and isinstance(w, QuantWeight)]

def dense_bytes(weights: dict) -> int:
  """Bytes of the float16 copies of the layers' matrices that prefill would keep (a float16 matrix is its own)."""
  return sum(2 * w.rows * w.cols for w in layer_matrices(weights) if w.qtype != QT.F16)

def as_matrix(rows) -> bool:
  """Whether an input of this many rows (constant) is a prefill chunk, whose products run as float16 matrices."""
  return isinstance(rows, int) and rows >= MATMUL_ROWS

@dataclass
class QuantWeight:
  """A weight matrix (rows, cols) held as planes on the device."""
  qtype: QT
  rows: int
  cols: int
  planes: dict[str, Tensor]
  splits: tuple[int, ...] = ()  # a fused weight (loader.load_weights): the row counts of the matrices it stacks
  dense: Tensor | None = None  # the matrix in float16, kept beside the planes for prefill chunks (keep_dense), else None

  @staticmethod
  def from_raw(raw: np.ndarray, qtype: QT, rows: int, cols: int, device: str) -> "QuantWeight":
    return QuantWeight(qtype, rows, cols, {k: Tensor(v, device=device) for k, v in repack(raw, qtype, rows, cols).items()})

  def nbytes(self) -> int: return sum(p.nbytes() for p in self.planes.values())  # the planes: what a decode step reads
  def keep_dense(self):
    """Keeps the matrix in float16 on the device for prefill chunks (dense_bytes: what all of them take)."""
    # a float16 matrix is its own copy (its plane), no second one
    self.dense = self.planes["w"] if self.qtype == QT.F16 else self.weights().cast(dtypes.float16).contiguous().realize()
  def weights(self) -> Tensor: return dequantize(self.planes, self.qtype)
  def affine(self, x: Tensor) -> bool:
    """Whether the product with x runs in the affine form (at most AFFINE_ROWS rows, of a type in AFFINE)."""
    return isinstance(x.shape[0], int) and x.shape[0] <= AFFINE_ROWS and self.qtype in AFFINE
  def tc(self, x: Tensor) -> bool:
    """Whether the product with x may run in tc_product's form (which writes x's float16 copy in a kernel of its own):
    its type, rows and size on a device with tensor cores. A prefill chunk takes it only as tc_form says."""
    return takes_tc(self.qtype, x.shape[0], self.rows * self.cols, x.device)
  def tc_form(self, x: Tensor) -> bool:
    """Whether __call__ takes tc_product's form: tc, where x is not a prefill chunk, or a chunk of at most
    TC_CHUNK_ROWS rows and no float16 copy."""
    return self.tc(x) and (not as_matrix(x.shape[0]) or (self.dense is None and x.shape[0] <= TC_CHUNK_ROWS))
  def members(self, x: Tensor) -> list[Tensor]:
    """x @ W.T of each matrix this weight stacks (splits), in order, in tc_product's form (where tc_form says it takes
    it: model.Fused checks) with each member's parts summed apart (SPLIT_SUMS)."""
    return tc_product(x, self.planes, self.qtype, self.splits)
  def rows_of(self, idx: Tensor) -> Tensor:
    """Dequantized rows idx (an int tensor of any shape) -> (*idx.shape, cols): the embedding lookup."""
    return dequantize({k: p[idx] for k, p in self.planes.items()}, self.qtype)
  def __call__(self, x: Tensor) -> Tensor:
    """x (T, cols) -> x @ W.T (T, rows). A few rows (decode): the weights are dequantized inside the reduction,
    each read once from the planes; from TC_ROWS rows on, a large Q4_K matrix on a device with tensor cores in
    tc_product's form (dequantized in float16 inside the product's kernel). From MATMUL_ROWS rows on (a prefill
    chunk): the matrix is dequantized once into a float16 scratch buffer and multiplied in float16 with float32 sums, the form tinygrad maps to tensor
    cores. The planes are read after the input is computed (AFTER: an ordering edge, no kernel), so each copy
    is made just before its product and the JIT's memory planner reuses one scratch for every matrix; unordered,
    every dequantization depends on weights alone, the scheduler ran them all up front and the prefill step
    held the whole model in float16 (1B: 1.9 GB). With a float16 copy kept (dense) that copy is the
    matrix: no dequantization in the step. Without one, a chunk of at most TC_CHUNK_ROWS rows takes tc_product's form."""
    if self.tc_form(x): return tc_product(x, self.planes, self.qtype)
    if as_matrix(x.shape[0]):
      x16 = x.cast(dtypes.float16).contiguous()
      if self.dense is not None: w = self.dense
      else:
        planes = {k: Tensor(p.uop.after(x16.uop)) for k, p in self.planes.items()}
        w = dequantize(planes, self.qtype).cast(dtypes.float16).contiguous()
      if (S:=split_parts(x.shape[0], self.cols)) == 1: return x16.matmul(w.T, dtype=dtypes.float32)
      # (S, T, L) @ (S, L, N): the parts written out (contiguous), else tinygrad merges both sums back into one
      L = self.cols // S
      xs, ws = x16.reshape(-1, S, L).permute(1, 0, 2), w.reshape(self.rows, S, L).permute(1, 2, 0)
      return xs.matmul(ws, dtype=dtypes.float32).contiguous().sum(0)
    if self.affine(x):
      return (mantissa_product if AFFINE_MANTISSA and self.qtype in MANTISSA_TYPES else affine_product)(x, self.planes, self.qtype)
    return (x.unsqueeze(-2) * self.weights()).sum(-1)
