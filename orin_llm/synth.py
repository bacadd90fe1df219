"""Synthetic GGUF models: LLaMA- or Qwen3-shaped files with random weights and a real vocabulary
taken from another GGUF file. Tests and benchmarks use them (`orin-llm synth`).

Two kinds of file. Float files (F16, BF16) are what users start from: scripts/make_models.sh has
llama.cpp's llama-quantize turn them into the Q4_K_M/Q6_K/Q8_0 files users download, with its mix
of types per tensor. Random quantized files are made here directly, without llama.cpp (CPU tests):
random bytes in every bit plane, with the float16 scale fields overwritten by finite values sized so
that dequantized weights have a chosen standard deviation: valid blocks of the type, whatever ggml's
own quantizer would have made of them. `llama_quantize_types` gives such a file llama-quantize's mix.

Files are written tensor by tensor (memory stays at one tensor), float matrices from a pool of
random values drawn once (_Floats): the 16 GB of an 8B F16 file take what the disk takes.
"""
from __future__ import annotations
import pathlib, time
from dataclasses import dataclass, replace
import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
from orin_llm.config import ModelConfig, arch_rules
from orin_llm.errors import OrinError
from orin_llm.gguf_file import GGUFFile
from orin_llm import log

# float16 fields per block: (byte offset, role). "d" scales the integer code, "m" is an additive min.
_F16_FIELDS = {QT.Q4_0: [(0, "d")], QT.Q4_1: [(0, "d"), (2, "m")], QT.Q5_0: [(0, "d")], QT.Q5_1: [(0, "d"), (2, "m")],
               QT.Q8_0: [(0, "d")], QT.Q4_K: [(0, "d"), (2, "m")], QT.Q5_K: [(0, "d"), (2, "m")], QT.Q6_K: [(208, "d")]}
# typical |integer code x sub-scale| of random bytes, so that d = std / spread gives weights of about that std
_SPREAD = {QT.Q4_0: 4.6, QT.Q4_1: 4.6, QT.Q5_0: 9.2, QT.Q5_1: 9.2, QT.Q8_0: 74.0, QT.Q4_K: 4.6 * 36, QT.Q5_K: 9.2 * 36, QT.Q6_K: 18.5 * 74}

def random_blocks(rng: np.random.Generator, qtype: QT, n_elements: int, std: float = 0.02) -> np.ndarray:
  """Raw bytes (uint8, n_elements/block * block_bytes) of valid random blocks of `qtype`."""
  if qtype == QT.F32: return rng.normal(0, std, n_elements).astype(np.float32).view(np.uint8)
  if qtype == QT.F16: return rng.normal(0, std, n_elements).astype(np.float16).view(np.uint8)
  if qtype == QT.BF16: return (rng.normal(0, std, n_elements).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
  block, bsize = GGML_QUANT_SIZES[qtype]
  b = rng.integers(0, 256, (n_elements // block, bsize), dtype=np.uint8)
  d = std / _SPREAD[qtype]
  for at, role in _F16_FIELDS[qtype]:
    if role == "d": v = rng.uniform(0.5 * d, 1.5 * d, len(b))
    elif qtype in (QT.Q4_1, QT.Q5_1): v = rng.uniform(-2 * std, 0, len(b))  # w = d*q + m: a negative min centres w
    else: v = rng.uniform(0, 0.2 * std, len(b))  # K-quants: w = d*sc*q - dmin*mn, dmin >= 0 and small
    b[:, at:at + 2] = v.astype(np.float16).view(np.uint8).reshape(-1, 2)
  return b.reshape(-1)

@dataclass(frozen=True)
class Shape(ModelConfig):
  """A preset: the ModelConfig its file will load as, and what only the writer needs."""
  rope_factor: float = 32.0  # Llama 3.x rope scaling factor (in rope_freqs.weight): 32 in Llama 3.2, 8 in Llama 3.1

def _shape(arch: str, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn_dim: int, context_length: int,
           rope_theta: float, norm_eps: float, tied_output: bool = True, rope_freq_factors: bool = False, rope_factor: float = 32.0) -> Shape:
  """A model's shape as the ModelConfig its file will load as (the vocabulary size is set when it is written)."""
  return Shape(arch=arch, n_layers=n_layers, dim=dim, ffn_dim=ffn_dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
               vocab_size=0, norm_eps=norm_eps, rope_theta=rope_theta, context_length=context_length, tied_output=tied_output,
               rope_freq_factors=rope_freq_factors, rope_factor=rope_factor, **arch_rules(arch))

# the public configs (Hugging Face config.json) of the models users run on an Orin; rope_freq_factors: Llama 3.x rope scaling
PRESETS = {
  "llama-3.2-1b": _shape("llama", 2048, 16, 32, 8, 64, 8192, 131072, 500000.0, 1e-5, True, True),
  "llama-3.2-3b": _shape("llama", 3072, 28, 24, 8, 128, 8192, 131072, 500000.0, 1e-5, True, True),
  "llama-3.1-8b": _shape("llama", 4096, 32, 32, 8, 128, 14336, 131072, 500000.0, 1e-5, False, True, 8.0),
  # Qwen3: q/k RMSNorm per head, heads x head_dim != dim in 0.6B (16 x 128 = 2048 over 1024); vocabulary 151936
  # (the Qwen2 tokenizer's 151643 tokens padded with unused ones, as in Qwen's GGUFs: embedding rows = tokens)
  "qwen3-0.6b": _shape("qwen3", 1024, 28, 16, 8, 128, 3072, 40960, 1000000.0, 1e-6, True, False),
  "qwen3-1.7b": _shape("qwen3", 2048, 28, 16, 8, 128, 6144, 40960, 1000000.0, 1e-6, True, False),
  "tiny-llama": _shape("llama", 256, 2, 4, 2, 64, 512, 2048, 10000.0, 1e-5, True, True),
  "tiny-qwen3": _shape("qwen3", 256, 2, 4, 2, 64, 512, 2048, 1000000.0, 1e-6, True, False),
}

_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                   "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template")

def llama3_rope_factors(head_dim: int, theta: float, factor=32.0, low=1.0, high=4.0, old_ctx=8192) -> np.ndarray:
  """Llama 3.1/3.2 rope scaling as ggml's rope_freqs.weight: a divisor per frequency (HF's llama3 rope type)."""
  freqs = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  wavelen = 2 * np.pi / freqs
  smooth = (old_ctx / wavelen - low) / (high - low)
  f = np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
  return f.astype(np.float32)

def add_tokenizer(w, md: dict):
  """Writes a vocabulary's tokenizer.* metadata (as gguf_file reads it) into a gguf.GGUFWriter."""
  for k, v in md.items():
    if k == "tokenizer.ggml.model": w.add_tokenizer_model(v)
    elif k == "tokenizer.ggml.pre": w.add_tokenizer_pre(v)
    elif k == "tokenizer.ggml.tokens": w.add_token_list(v)
    elif k == "tokenizer.ggml.token_type": w.add_token_types(v)
    elif k == "tokenizer.ggml.merges": w.add_token_merges(v)
    elif k == "tokenizer.chat_template": w.add_chat_template(v)
    elif isinstance(v, bool): w.add_bool(k, v)
    elif isinstance(v, int): w.add_uint32(k, v)

def write_model(path: str | pathlib.Path, shape: ModelConfig, qtype: QT, vocab_from: str | pathlib.Path, seed: int = 0,
                types: dict[str, QT] | None = None, vocab_size: int | None = None) -> pathlib.Path:
  """Writes a model file. `types` overrides the tensor type per tensor-name suffix (e.g. {"token_embd.weight": QT.Q8_0}).
  `vocab_size` truncates the vocabulary (small test models; the tokenizer then covers only the first ids)."""
  if shape.arch not in ("llama", "qwen3"): raise OrinError(f"synth: unknown architecture {shape.arch!r} (llama, qwen3)")
  src = GGUFFile(vocab_from)
  md = {k: src.metadata[k] for k in _TOKENIZER_KEYS if k in src.metadata}
  if "tokenizer.ggml.tokens" not in md: raise OrinError(f"{vocab_from}: has no tokenizer.ggml.tokens to take a vocabulary from")
  if vocab_size:  # the first ids, and only the merges that stay inside them, so that the tokenizer still builds
    md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.tokens"][:vocab_size], md["tokenizer.ggml.token_type"][:vocab_size]
    keep = set(md["tokenizer.ggml.tokens"])
    md["tokenizer.ggml.merges"] = [m for m in md.get("tokenizer.ggml.merges", []) if (ab := m.split(" ", 1)) and len(ab) == 2
                                   and ab[0] in keep and ab[1] in keep and ab[0] + ab[1] in keep]
    for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id"):
      if md.get(k, 0) >= vocab_size: md[k] = vocab_size - 1  # special ids past the cut: the last id stands in
  vocab = len(md["tokenizer.ggml.tokens"])
  rng = np.random.default_rng(seed)
  path, t0 = pathlib.Path(path), time.monotonic()
  w = gguf.GGUFWriter(str(path), shape.arch)
  a = shape.arch
  w.add_block_count(shape.n_layers); w.add_context_length(shape.context_length); w.add_embedding_length(shape.dim)
  w.add_feed_forward_length(shape.ffn_dim); w.add_head_count(shape.n_heads); w.add_head_count_kv(shape.n_kv_heads)
  w.add_rope_freq_base(shape.rope_theta); w.add_layer_norm_rms_eps(shape.norm_eps); w.add_vocab_size(vocab)
  w.add_rope_dimension_count(shape.head_dim); w.add_key_length(shape.head_dim); w.add_value_length(shape.head_dim)
  w.add_name(f"orin-llm synthetic {a} {qtype.name}"); w.add_file_type(int(_FILE_TYPE.get(qtype, 0)))
  add_tokenizer(w, md)
  types, plan = types or {}, []
  shape = replace(shape, vocab_size=vocab, **arch_rules(shape.arch))
  for name, shp in shape.tensor_shapes().items():  # the loader's own list; infos first, data after: one tensor in memory at a time
    qt = QT.F32 if len(shp) == 1 else next((t for suffix, t in types.items() if name.endswith(suffix)), qtype)
    std = 1.0 if name == "token_embd.weight" and not shape.tied_output else 0.5 / np.sqrt(shp[-1])
    if name == "token_embd.weight" and shape.tied_output: std = 2.0 / np.sqrt(shp[1])
    block, bsize = GGML_QUANT_SIZES[qt]
    nbytes = int(np.prod(shp)) // block * bsize
    if qt in _FLOATS: w.add_tensor_info(name, shp, np.dtype(np.uint16), nbytes, raw_dtype=qt)  # not uint8: shape in elements
    else: w.add_tensor_info(name, _raw_shape(qt, shp), np.dtype(np.uint8), nbytes, raw_dtype=qt)
    plan.append((name, shp, qt, float(std), nbytes))
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_ti_data_to_file()
  fout = w.fout[0]
  floats = _Floats(rng, max((int(np.prod(s)) for _, s, qt, _, _ in plan if qt in _FLOATS and len(s) == 2), default=0))
  for name, shp, qt, std, nbytes in plan:
    w.write_padding(fout, fout.tell())
    if name == "rope_freqs.weight": parts = [llama3_rope_factors(shape.head_dim, shape.rope_theta, getattr(shape, "rope_factor", 32.0))]
    elif len(shp) == 1: parts = [rng.uniform(0.8, 1.2, shp).astype(np.float32)]  # norm weights: around 1, activations keep their scale
    elif qt in _FLOATS: parts = floats.parts(qt, int(np.prod(shp)), std)
    else: parts = [random_blocks(rng, qt, shp[0] * shp[1], std)]
    n = 0
    for part in parts: fout.write(part.data); n += part.nbytes
    assert n == nbytes, (name, n, nbytes)
    w.write_padding(fout, nbytes)
  w.close()
  log.info(f"synth: wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.monotonic() - t0:.1f} s")
  return path

_FLOATS = (QT.F32, QT.F16, QT.BF16)
_POOL, _TILE = 1 << 25, 1 << 20

class _Floats:
  """Random float matrices, fast: one pool of standard normals (at most _POOL, 128 MiB) drawn once,
  scaled and converted once per (type, std), and each matrix made of tiles of _TILE values copied
  from random offsets of it. Drawing the 8G normals of an 8B model would take minutes; this takes
  what writing takes. Repeated tiles do not matter to anything a benchmark file is for."""
  def __init__(self, rng: np.random.Generator, n: int):
    self.rng, self.n, self.pools = rng, min(n, _POOL), {}
  def parts(self, qt: QT, n: int, std: float):
    if (qt, std) not in self.pools:
      if not self.pools: self.base = self.rng.standard_normal(self.n, dtype=np.float32)
      x = self.base * np.float32(std)
      self.pools[qt, std] = x if qt == QT.F32 else x.astype(np.float16) if qt == QT.F16 else (x.view(np.uint32) >> 16).astype(np.uint16)
    pool = self.pools[qt, std]
    while n > 0:
      k = min(n, _TILE, len(pool))
      o = int(self.rng.integers(0, len(pool) - k + 1))
      yield pool[o:o + k]
      n -= k

def llama_quantize_types(s: ModelConfig, ftype: str) -> tuple[QT, dict[str, QT]]:
  """The main type and per-tensor types that llama.cpp's llama-quantize gives a model of this shape for
  `ftype` (its llama_tensor_get_type, llama.cpp src/llama-quant.cpp): Q4_K_M keeps attn_v and ffn_down
  of the first and last eighth of the layers and of every third layer between in Q6_K, the rest in Q4_K;
  the output head (the embedding when tied) is Q6_K unless the file is Q8_0. For random quantized files
  with the layout of a downloaded one (CPU tests); the benchmark files come from llama-quantize itself."""
  ftype = ftype.upper()
  main = QT.Q4_K if ftype == "Q4_K_M" else QT[ftype]
  more_bits = lambda i, n: i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
  types = {} if main == QT.Q8_0 else {("token_embd.weight" if s.tied_output else "output.weight"): QT.Q6_K}
  if ftype == "Q4_K_M":
    for i in range(s.n_layers):
      if more_bits(i, s.n_layers): types |= {f"blk.{i}.attn_v.weight": QT.Q6_K, f"blk.{i}.ffn_down.weight": QT.Q6_K}
  return main, types

def _raw_shape(qt: QT, shp: tuple[int, int]) -> tuple[int, ...]:
  block, bsize = GGML_QUANT_SIZES[qt]
  return (shp[0], shp[1] // block * bsize)

_FILE_TYPE = {QT.F32: 0, QT.F16: 1, QT.Q4_0: 2, QT.Q4_1: 3, QT.Q8_0: 7, QT.Q5_0: 8, QT.Q5_1: 9,
              QT.Q4_K: 15, QT.Q5_K: 17, QT.Q6_K: 18, QT.BF16: 32}

def preset(name: str, **overrides) -> Shape:
  if name not in PRESETS: raise OrinError(f"synth: unknown preset {name!r} (known: {', '.join(PRESETS)})")
  return replace(PRESETS[name], **overrides)
