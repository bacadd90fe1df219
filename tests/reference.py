"""An independent float64 numpy implementation of the LLaMA / Qwen3 decoder, for tests only.

It shares no code with orin_llm's model: weights are dequantized by `gguf.quants.dequantize`,
metadata is read by `gguf.GGUFReader`, and RoPE follows ggml's definitions (llama: adjacent pairs,
"normal" mode; qwen3: halves, "neox" mode; Llama 3 frequency divisors from rope_freqs.weight).
The keys and values it caches are rounded to float16, as the engine's KV cache holds them (by design): on random
tiny models that rounding alone can move a position's logits by a few percent (a qwen3 model with seed
3842611997: 2.96%, while the engine matched the float16-cache reference within 0.14%), which is no bug of the engine.

Reference(path, float16=True) also rounds what the engine's float16 matrix steps round (prefill chunks of
quant.MATMUL_ROWS rows and more, and the tensor cores' forms): the blocks' weight matrices and the inputs of every
product (the norms' outputs, the queries and probabilities of attention, the attention's and the FFN's outputs), sums
in float64. Tests of those steps compare with it: at a few positions of a random tiny model that rounding alone moves
the logits by several percent, and there the engine follows it. Measured (Qwen3 Q5_K, ORIN_TEST_SEED=3087999216, the
193-token prompt of test_chunk_size_classes_match_reference): the float16 reference 9.6% from the float64 one at the
last position, the engine's prefill 9.4% from the float64 and 0.21% from the float16 reference; over that prompt's
positions the rounding's effect has a median of 5e-5 and reached 1e-2 at two of 193.
"""
import numpy as np
import gguf

class Reference:
  def __init__(self, path, float16: bool = False):
    r = gguf.GGUFReader(path)
    md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    a = md["general.architecture"]
    self.arch = a
    self.n_layers, self.dim = md[f"{a}.block_count"], md[f"{a}.embedding_length"]
    self.n_heads, self.n_kv = md[f"{a}.attention.head_count"], md[f"{a}.attention.head_count_kv"]
    self.head_dim = md.get(f"{a}.attention.key_length", self.dim // self.n_heads)
    self.eps, self.theta = md[f"{a}.attention.layer_norm_rms_epsilon"], md.get(f"{a}.rope.freq_base", 10000.0)
    self.w = {}
    for t in r.tensors:
      shape = tuple(int(x) for x in reversed(t.shape))
      self.w[t.name] = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64).reshape(shape)
    if "output.weight" not in self.w: self.w["output.weight"] = self.w["token_embd.weight"]
    self.f = self.stored if float16 else (lambda t: t)  # a product's input as the matrix steps hold it
    if float16:
      for n, t in self.w.items():
        if n.startswith("blk.") and t.ndim == 2: self.w[n] = self.stored(t)
    self.k_cache, self.v_cache = [[] for _ in range(self.n_layers)], [[] for _ in range(self.n_layers)]

  @staticmethod
  def stored(t: np.ndarray) -> np.ndarray: return t.astype(np.float16).astype(np.float64)  # the KV cache's float16

  def norm(self, x, w): return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

  def rope(self, x, pos):
    d = self.head_dim
    inv = self.theta ** -(np.arange(0, d, 2) / d)
    if "rope_freqs.weight" in self.w: inv = inv / self.w["rope_freqs.weight"]
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    out = np.empty_like(x)
    if self.arch == "qwen3": i0, i1 = np.arange(d // 2), np.arange(d // 2) + d // 2
    else: i0, i1 = np.arange(0, d, 2), np.arange(1, d, 2)
    out[..., i0] = x[..., i0] * c - x[..., i1] * s
    out[..., i1] = x[..., i0] * s + x[..., i1] * c
    return out

  def step(self, token: int) -> np.ndarray:
    """Appends one token at the next position; returns that position's logits."""
    pos = len(self.k_cache[0])
    x = self.w["token_embd.weight"][token]
    for i in range(self.n_layers):
      w = lambda n: self.w[f"blk.{i}.{n}.weight"]
      f = self.f
      h = f(self.norm(x, w("attn_norm")))
      q = (w("attn_q") @ h).reshape(self.n_heads, self.head_dim)
      k = (w("attn_k") @ h).reshape(self.n_kv, self.head_dim)
      v = (w("attn_v") @ h).reshape(self.n_kv, self.head_dim)
      if self.arch == "qwen3": q, k = self.norm(q, w("attn_q_norm")), self.norm(k, w("attn_k_norm"))
      q, k = self.rope(q, pos), self.rope(k, pos)
      self.k_cache[i].append(self.stored(k)); self.v_cache[i].append(self.stored(v))
      K, V = np.stack(self.k_cache[i], 1), np.stack(self.v_cache[i], 1)  # (kv, L, d)
      g = self.n_heads // self.n_kv
      out = np.empty((self.n_heads, self.head_dim))
      for hh in range(self.n_heads):
        sc = K[hh // g] @ f(q[hh]) / np.sqrt(self.head_dim)
        p = np.exp(sc - sc.max()); p /= p.sum()
        out[hh] = f(p) @ V[hh // g]
      x = x + w("attn_output") @ f(out.reshape(-1))
      h = f(self.norm(x, w("ffn_norm")))
      gate, up = w("ffn_gate") @ h, w("ffn_up") @ h
      x = x + w("ffn_down") @ f(gate / (1 + np.exp(-gate)) * up)
    return self.w["output.weight"] @ self.norm(x, self.w["output_norm.weight"])

  def run(self, tokens: list[int]) -> np.ndarray:
    """Appends tokens; returns the last one's logits."""
    for t in tokens: logits = self.step(t)
    return logits

def assert_greedy_matches(ref: Reference, logits: np.ndarray, tokens: list[int]) -> np.ndarray:
  """tokens, a greedy continuation, against the reference: each its argmax, or within a near tie of it (1e-3 of the
  largest logit: a random tiny model has such ties, and two correct paths may choose either). logits: the reference's
  after the prompt; each token but the last is then run through ref. Returns the logits that chose the last token."""
  for i, tok in enumerate(tokens):
    best = int(np.argmax(logits))
    assert tok == best or logits[best] - logits[tok] < 1e-3 * np.abs(logits).max(), (i, tokens, best)
    if i < len(tokens) - 1: logits = ref.step(tok)
  return logits
