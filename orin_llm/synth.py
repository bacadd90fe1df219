"""Synthetic GGUF models: LLaMA- or Qwen3-shaped files with random quantized weights and a real
vocabulary taken from another GGUF file. Tests and benchmarks use them (`orin-llm synth`).

Random quantized weights are random bytes in every bit plane, with the float16 scale fields
overwritten by finite values sized so that dequantized weights have a chosen standard deviation:
valid blocks of the type, whatever ggml's own quantizer would have made of them.
"""
from __future__ import annotations
import pathlib
from dataclasses import replace
import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGML_QUANT_SIZES
from orin_llm.config import ModelConfig, arch_rules
from orin_llm.errors import OrinError
from orin_llm.gguf_file import GGUFFile

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

def _shape(arch: str, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn_dim: int, context_length: int,
           rope_theta: float, norm_eps: float, tied_output: bool = True, rope_freq_factors: bool = False) -> ModelConfig:
  """A model's shape as the ModelConfig its file will load as (the vocabulary size is set when it is written)."""
  return ModelConfig(arch=arch, n_layers=n_layers, dim=dim, ffn_dim=ffn_dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                     vocab_size=0, norm_eps=norm_eps, rope_theta=rope_theta, context_length=context_length, tied_output=tied_output,
                     rope_freq_factors=rope_freq_factors, **arch_rules(arch))

PRESETS = {  # rope_freq_factors: Llama 3.x rope scaling (rope_freqs.weight)
  "llama-3.2-1b": _shape("llama", 2048, 16, 32, 8, 64, 8192, 131072, 500000.0, 1e-5, True, True),
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
  path = pathlib.Path(path)
  w = gguf.GGUFWriter(str(path), shape.arch)
  a = shape.arch
  w.add_block_count(shape.n_layers); w.add_context_length(shape.context_length); w.add_embedding_length(shape.dim)
  w.add_feed_forward_length(shape.ffn_dim); w.add_head_count(shape.n_heads); w.add_head_count_kv(shape.n_kv_heads)
  w.add_rope_freq_base(shape.rope_theta); w.add_layer_norm_rms_eps(shape.norm_eps); w.add_vocab_size(vocab)
  w.add_rope_dimension_count(shape.head_dim); w.add_key_length(shape.head_dim); w.add_value_length(shape.head_dim)
  w.add_name(f"orin-llm synthetic {a} {qtype.name}"); w.add_file_type(int(_FILE_TYPE.get(qtype, 0)))
  for k, v in md.items():
    if k == "tokenizer.ggml.model": w.add_tokenizer_model(v)
    elif k == "tokenizer.ggml.pre": w.add_tokenizer_pre(v)
    elif k == "tokenizer.ggml.tokens": w.add_token_list(v)
    elif k == "tokenizer.ggml.token_type": w.add_token_types(v)
    elif k == "tokenizer.ggml.merges": w.add_token_merges(v)
    elif k == "tokenizer.chat_template": w.add_chat_template(v)
    elif isinstance(v, bool): w.add_bool(k, v)
    elif isinstance(v, int): w.add_uint32(k, v)
  types = types or {}
  shape = replace(shape, vocab_size=vocab, **arch_rules(shape.arch))
  for name, shp in shape.tensor_shapes().items():  # the loader's own list
    if name == "rope_freqs.weight":
      w.add_tensor(name, llama3_rope_factors(shape.head_dim, shape.rope_theta)); continue
    if len(shp) == 1:  # norm weights stay float32, around 1 so that activations keep their scale
      w.add_tensor(name, rng.uniform(0.8, 1.2, shp).astype(np.float32)); continue
    qt = next((t for suffix, t in types.items() if name.endswith(suffix)), qtype)
    std = 1.0 if name == "token_embd.weight" and not shape.tied_output else 0.5 / np.sqrt(shp[1])
    if name == "token_embd.weight" and shape.tied_output: std = 2.0 / np.sqrt(shp[1])
    raw = random_blocks(rng, qt, shp[0] * shp[1], float(std))
    w.add_tensor(name, raw, raw_shape=_raw_shape(qt, shp), raw_dtype=qt)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return path

def _raw_shape(qt: QT, shp: tuple[int, int]) -> tuple[int, ...]:
  block, bsize = GGML_QUANT_SIZES[qt]
  return (shp[0], shp[1] // block * bsize)

_FILE_TYPE = {QT.F32: 0, QT.F16: 1, QT.Q4_0: 2, QT.Q4_1: 3, QT.Q8_0: 7, QT.Q5_0: 8, QT.Q5_1: 9,
              QT.Q4_K: 15, QT.Q5_K: 17, QT.Q6_K: 18, QT.BF16: 32}

def preset(name: str, **overrides) -> ModelConfig:
  if name not in PRESETS: raise OrinError(f"synth: unknown preset {name!r} (known: {', '.join(PRESETS)})")
  return replace(PRESETS[name], **overrides)
