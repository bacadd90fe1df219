"""Model configuration from GGUF metadata, and validation of the file's tensors against it."""
from __future__ import annotations
from dataclasses import dataclass
from orin_llm.errors import OrinError
from orin_llm.gguf_file import GGUFFile
from orin_llm.quant import SUPPORTED

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

def config_from_gguf(f: GGUFFile) -> ModelConfig:
  md = f.metadata
  arch = md.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise OrinError(f"{f.path}: unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")
  def get(key, default=None):
    v = md.get(f"{arch}.{key}", default)
    if v is None: raise OrinError(f"{f.path}: metadata key {arch}.{key} is missing")
    return v
  n_heads, dim = int(get("attention.head_count")), int(get("embedding_length"))
  head_dim = int(get("attention.key_length", dim // n_heads))
  if "token_embd.weight" not in f: raise OrinError(f"{f.path}: tensor token_embd.weight is missing")
  vocab = int(md.get(f"{arch}.vocab_size", f.tensors["token_embd.weight"].shape[0]))
  cfg = ModelConfig(
    arch=arch, n_layers=int(get("block_count")), dim=dim, ffn_dim=int(get("feed_forward_length")), n_heads=n_heads,
    n_kv_heads=int(get("attention.head_count_kv", n_heads)), head_dim=head_dim, vocab_size=vocab,
    norm_eps=float(get("attention.layer_norm_rms_epsilon")), rope_theta=float(get("rope.freq_base", 10000.0)),
    context_length=int(get("context_length")), tied_output="output.weight" not in f, rope_freq_factors="rope_freqs.weight" in f,
    **arch_rules(arch))
  if int(get("rope.dimension_count", head_dim)) != head_dim:
    raise OrinError(f"{f.path}: partial rotary embeddings ({arch}.rope.dimension_count != head dim) are not supported")
  if cfg.n_heads % cfg.n_kv_heads: raise OrinError(f"{f.path}: {n_heads} heads do not divide into {cfg.n_kv_heads} KV heads")
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
