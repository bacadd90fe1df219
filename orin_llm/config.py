"""Model configuration from GGUF metadata, and validation of the file's tensors against it."""
from __future__ import annotations
import math, re
from dataclasses import dataclass
from gguf import GGMLQuantizationType as QT
from orin_llm.errors import OrinError
from orin_llm.gguf_file import GGUFFile
from orin_llm.quant import SUPPORTED

FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)  # norms and other vectors: the loader reads them as floats, never as blocks

ARCHITECTURES = ("llama", "qwen3")

def arch_rules(arch: str) -> dict:
  """What the architecture alone decides: Qwen3 rotates (i, i+d/2) pairs and normalizes each head's q and k."""
  return {"rope_neox": arch == "qwen3", "qk_norm": arch == "qwen3"}

@dataclass(frozen=True)
class ModelConfig:
  arch: str
  n_layers: int
  dim: int
  ffn_dim: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  vocab_size: int
  norm_eps: float
  rope_theta: float
  rope_neox: bool          # rotate (i, i+d/2) pairs (qwen3) rather than adjacent (2i, 2i+1) pairs (llama in GGUF)
  context_length: int      # what the model was trained for; the engine may use less
  qk_norm: bool            # qwen3: RMSNorm of each head's q and k before RoPE
  tied_output: bool        # no output.weight: the output head is token_embd.weight
  rope_freq_factors: bool  # Llama 3.x: rope_freqs.weight divides each rotation frequency

  def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
    t = {"token_embd.weight": (self.vocab_size, self.dim), "output_norm.weight": (self.dim,)}
    if not self.tied_output: t["output.weight"] = (self.vocab_size, self.dim)
    if self.rope_freq_factors: t["rope_freqs.weight"] = (self.head_dim // 2,)
    q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    for i in range(self.n_layers):
      p = f"blk.{i}."
      t |= {p + "attn_norm.weight": (self.dim,), p + "attn_q.weight": (q, self.dim), p + "attn_k.weight": (kv, self.dim),
            p + "attn_v.weight": (kv, self.dim), p + "attn_output.weight": (self.dim, q), p + "ffn_norm.weight": (self.dim,),
            p + "ffn_gate.weight": (self.ffn_dim, self.dim), p + "ffn_up.weight": (self.ffn_dim, self.dim),
            p + "ffn_down.weight": (self.dim, self.ffn_dim)}
      if self.qk_norm: t |= {p + "attn_q_norm.weight": (self.head_dim,), p + "attn_k_norm.weight": (self.head_dim,)}
    return t

MAX_CONTEXT = 1 << 24  # tokens: far past any model's training context, and a bound for what follows from it

def config_from_gguf(f: GGUFFile) -> ModelConfig:
  """The configuration the metadata describes, checked against the tensors the file holds before anything is
  allocated: a file from the internet may hold any value in any field, and each gets a one-line error."""
  md = f.metadata
  arch = md.get("general.architecture")
  if not isinstance(arch, str) or arch not in ARCHITECTURES:
    raise OrinError(f"{f.path}: unsupported architecture {arch!r:.60} (supported: {', '.join(ARCHITECTURES)})")
  def get(key, default=None, lo=1, hi=1 << 31, number=False):
    v = md.get(f"{arch}.{key}", default)
    if v is None: raise OrinError(f"{f.path}: metadata key {arch}.{key} is missing")
    ok = isinstance(v, (int, float)) and math.isfinite(v) if number else isinstance(v, int)
    if isinstance(v, bool) or not ok or not lo <= v <= hi:
      wants = f"a number in {lo:g}..{hi:g}" if number else f"an integer in {lo}..{hi}"
      raise OrinError(f"{f.path}: metadata key {arch}.{key} must be {wants}, not {v!r:.60}")
    return v
  if "token_embd.weight" not in f: raise OrinError(f"{f.path}: tensor token_embd.weight is missing")
  embd = f.tensors["token_embd.weight"]
  if len(embd.shape) != 2: raise OrinError(f"{f.path}: tensor token_embd.weight has shape {embd.shape}, not (vocabulary, embedding)")
  # the layers the file holds bound block_count: 0xFFFFFFFF layers would be described (and allocated) one by one
  blocks = {int(m.group(1)) for name in f.tensors if (m := re.match(r"blk\.(\d+)\.", name))}
  n_layers = get("block_count", hi=1 << 62)
  if n_layers > len(blocks): raise OrinError(f"{f.path}: {arch}.block_count is {n_layers}, but the file holds the tensors of {len(blocks)} blocks")
  dim = get("embedding_length")
  n_heads = get("attention.head_count", hi=dim)
  n_kv_heads = get("attention.head_count_kv", n_heads, hi=n_heads)
  if n_heads % n_kv_heads: raise OrinError(f"{f.path}: {n_heads} heads do not divide into {n_kv_heads} KV heads")
  head_dim = get("attention.key_length", dim // n_heads, hi=1 << 16)
  if head_dim % 2: raise OrinError(f"{f.path}: metadata key {arch}.attention.key_length is {head_dim}; rotary embeddings need an even head size")
  if get("attention.value_length", head_dim) != head_dim:
    raise OrinError(f"{f.path}: {arch}.attention.value_length differs from the key length {head_dim}; not supported")
  cfg = ModelConfig(
    arch=arch, n_layers=n_layers, dim=dim, ffn_dim=get("feed_forward_length"), n_heads=n_heads,
    n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=get("vocab_size", embd.shape[0]),
    norm_eps=float(get("attention.layer_norm_rms_epsilon", lo=0, hi=1, number=True)),
    rope_theta=float(get("rope.freq_base", 10000.0, lo=1e-3, hi=1e12, number=True)),
    context_length=get("context_length", hi=MAX_CONTEXT), tied_output="output.weight" not in f,
    rope_freq_factors="rope_freqs.weight" in f, **arch_rules(arch))
  if get("rope.dimension_count", head_dim) != head_dim:
    raise OrinError(f"{f.path}: partial rotary embeddings ({arch}.rope.dimension_count != head dim) are not supported")
  validate(f, cfg)
  return cfg

def validate(f: GGUFFile, cfg: ModelConfig):
  """Every tensor the architecture needs is present with the shape the metadata implies and a supported type."""
  for name, shape in cfg.tensor_shapes().items():
    if name not in f: raise OrinError(f"{f.path}: tensor {name} is missing")
    t = f.tensors[name]
    if t.shape != shape:
      raise OrinError(f"{f.path}: tensor {name} has shape {t.shape}, but the metadata implies {shape}")
    if t.qtype not in SUPPORTED:
      raise OrinError(f"{f.path}: tensor {name} has unsupported type {t.qtype.name} (supported: {', '.join(q.name for q in SUPPORTED)})")
    if len(shape) == 1 and t.qtype not in FLOAT_TYPES:
      raise OrinError(f"{f.path}: tensor {name} is stored as {t.qtype.name}; vectors (norms, rope factors) must be F32, F16 or BF16")
