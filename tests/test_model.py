"""The decoder against an independent float64 numpy reference (tests/reference.py), on small
synthetic models of both architectures and several tensor types, drawn fresh each run."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.engine import Engine
from orin_llm.model import KV_BLOCK, ROW_BLOCK
from orin_llm.synth import write_model, preset
from reference import Reference, assert_greedy_matches
from conftest import LLAMA_VOCAB, QWEN_VOCAB, seed_for

VOCAB = 2048
# every test of a case shares its engine (an engine's steps are compiled and captured once); its context spans more
# than one key block of either attention form (model.KV_BLOCK, ROW_BLOCK) and is a multiple of neither, for
# test_context_end_and_stale_cache
CONTEXT = ROW_BLOCK + KV_BLOCK + 13
CASES = {  # name: (preset, main type, per-tensor overrides)
  "llama-q4k": ("tiny-llama", QT.Q4_K, {"token_embd.weight": QT.Q8_0}),
  "llama-q6k": ("tiny-llama", QT.Q6_K, {}),
  "llama-q4_0-mixed": ("tiny-llama", QT.Q4_0, {"attn_v.weight": QT.Q8_0, "ffn_up.weight": QT.Q5_0, "token_embd.weight": QT.F16}),
  "qwen3-q5k": ("tiny-qwen3", QT.Q5_K, {"token_embd.weight": QT.Q6_K}),
  "qwen3-q4_1": ("tiny-qwen3", QT.Q4_1, {"ffn_down.weight": QT.Q5_1, "token_embd.weight": QT.BF16}),
}

def rel_err(a, b): return float(np.linalg.norm(a - b) / np.linalg.norm(b))

@pytest.fixture(scope="module", params=list(CASES))
def model(request, tmp_path_factory):
  name = request.param
  pre, qt, types = CASES[name]
  vocab = QWEN_VOCAB if pre.endswith("qwen3") else LLAMA_VOCAB
  path = write_model(tmp_path_factory.mktemp(name) / f"{name}.gguf", preset(pre), qt, vocab, seed=seed_for(f"model {name}"),
                     types=types, vocab_size=VOCAB)
  return path, Engine(path, max_context=CONTEXT, chunk=8)

def test_logits_match_reference(model, rng):
  path, eng = model
  ref = Reference(path)
  prompt = rng.integers(0, VOCAB, 11).tolist()
  for t in prompt[:-1]: ref.step(t)
  want = ref.step(prompt[-1])
  got = eng.forward(prompt, 0)  # the whole prompt as one chunk
  assert rel_err(got, want) < 1e-2
  for t in rng.integers(0, VOCAB, 5).tolist():  # then single-token steps at later positions
    assert rel_err(eng.forward([t], len(eng.cached)), ref.step(t)) < 1e-2

def test_greedy_matches_reference(model, rng):
  path, eng = model
  ref = Reference(path)
  prompt = rng.integers(0, VOCAB, 7).tolist()
  got = list(eng.generate(prompt, 16))
  assert len(got) == 16
  assert_greedy_matches(ref, ref.run(prompt), got)

def near_tie(eng, prefix, a, b) -> bool:
  """Whether tokens a and b are (nearly) equally likely after prefix: the only excuse for two correct
  paths to choose differently (random tiny models often have such ties)."""
  eng.reset()
  lg = eng.forward(prefix, 0)
  return abs(lg[a] - lg[b]) < 1e-3 * np.abs(lg).max()

def assert_same_but_for_ties(eng, prefix, xs, ys):
  """Two greedy continuations of prefix agree up to the first near tie."""
  for i, (a, b) in enumerate(zip(xs, ys)):
    if a != b:
      assert near_tie(eng, prefix + xs[:i], a, b), (i, xs, ys)
      return

def test_prefill_then_decode_equals_token_by_token(model, rng):
  path, eng = model
  prompt = rng.integers(0, VOCAB, 21).tolist()  # three chunks of 8, the last one partial
  eng.reset()
  whole = eng.forward(prompt, 0)
  eng.reset()
  for i, t in enumerate(prompt): stepped = eng.forward([t], i)
  assert rel_err(stepped, whole) < 1e-3
  # the compiled steps: chunked prefill, against a cache filled one token at a time
  eng.reset()
  chunked = list(eng.generate(prompt, 6))
  compiled_kv = [b.cache.numpy()[:len(prompt), 0].astype(np.float32) for b in eng.model.blocks]
  eng.reset()
  eng.forward(prompt, 0)
  for got, b in zip(compiled_kv, eng.model.blocks):  # every position of every chunk, the first ones included
    want = b.cache.numpy()[:len(prompt), 0].astype(np.float32)
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
  eng.reset()
  for i, t in enumerate(prompt[:-1]): eng.forward([t], i)
  one_by_one = list(eng.generate(prompt, 6))  # reuses the 20 cached positions, runs only the last token
  assert_same_but_for_ties(eng, prompt, chunked, one_by_one)

def test_prefix_reuse_gives_same_tokens(model, rng):
  path, eng = model
  a = rng.integers(0, VOCAB, 12).tolist()
  first = list(eng.generate(a, 5))
  b = a + first[:-1] + rng.integers(0, VOCAB, 3).tolist()  # a follow-up that extends the earlier turn
  reused = list(eng.generate(b, 5))
  eng.reset()
  fresh = list(eng.generate(b, 5))
  assert_same_but_for_ties(eng, b, reused, fresh)

def test_lookahead_gives_same_tokens(model, rng):
  path, eng = model
  prompt = rng.integers(0, VOCAB, 9).tolist()
  eng.reset()
  one = list(eng.generate(prompt, 12, lookahead=1))
  eng.reset()
  four = list(eng.generate(prompt, 12, lookahead=4))
  assert one == four  # the same compiled step on the same inputs: no excuse for any difference

def test_context_end_and_stale_cache(model, rng):
  """A context that is not a multiple of the attention's key blocks (model.KV_BLOCK, ROW_BLOCK), filled to its end, then a
  shorter sequence over the same cache: the masked tail of the last block holds the earlier sequence's keys and
  values, and must not leak into the new one's logits."""
  path, eng = model
  long = rng.integers(0, VOCAB, CONTEXT - 9).tolist()
  got = list(eng.generate(long, 50))
  assert len(got) == 9  # stops at the end of the context
  ref = Reference(path)
  short = rng.integers(0, VOCAB, 6).tolist()
  want = ref.run(short)
  eng.reset()
  assert_greedy_matches(ref, want, list(eng.generate(short, 8)))
  eng.reset()
  assert rel_err(eng.forward(short, 0), want) < 1e-2  # the plain path over the same stale cache

@pytest.mark.parametrize("rows", [16])
def test_matmul_prefill_matches_reference(model, rng, monkeypatch, rows):
  """Prefill chunks of MATMUL_ROWS rows and more take the other path: weights dequantized into a float16 scratch
  and multiplied as matrices (their reductions in parts, as a small chunk's), attention as two float16 matrix
  products (model.Block.attend_chunk). Against the reference that rounds as these steps do (Reference(float16=True):
  at a few positions of a random model the rounding alone moves the logits by several percent), through a padded
  last chunk, then decode over the keys and values it wrote."""
  from orin_llm import quant
  path, _ = model
  if "q4_0" in path.name or "q4_1" in path.name: pytest.skip("two cases cover the path; compiling costs CI time")
  monkeypatch.setattr(quant, "MATMUL_ROWS", rows)
  # the reductions split into parts (quant.SPLIT_LEN), as a GPU's chunk of 32 rows runs them; test_chunk_size_classes
  # runs the unsplit products (the tiny models' rows are no longer than the default part)
  monkeypatch.setattr(quant, "SPLIT_LEN", 128)
  assert quant.split_parts(rows, 256) == 2 and quant.split_parts(rows, 512) == 4  # the tiny models' dim and ffn_dim
  assert quant.split_parts(64, 256) == 1 and quant.split_parts(64, 512) == 2 and quant.split_parts(rows, 128) == 1
  # no float16 copies (prefill_copy_mb=0): the path that dequantizes each matrix in the step, whose scratch is checked
  # below (a model whose copies do not fit the bound, as the 8B's by default, runs it)
  eng = Engine(path, max_context=128, chunk=rows, prefill_copy_mb=0)
  ref = Reference(path, float16=True)
  prompt = rng.integers(0, VOCAB, 2 * rows + 5).tolist()  # two full chunks and a padded one
  logits = ref.run(prompt)
  next(iter(eng.generate(prompt, 1)))
  assert rel_err(eng.state.logits[0].numpy(), logits) < 1e-2  # float16 activations (llama.cpp's precision too), as ref's
  # one float16 copy of a matrix at a time: the dequantization is ordered after the matrix's input, so that the
  # JIT's planner reuses its scratch (unordered, every copy was made up front: the whole model in float16)
  from orin_llm.step_cache import scratch_bytes
  from orin_llm.quant import QuantWeight
  fp16 = [2 * w.rows * w.cols for n, w in eng.weights.items() if isinstance(w, QuantWeight) and n.startswith("blk.")]
  assert scratch_bytes(eng)[f"chunk{rows}"] < sum(fp16) / 2, (scratch_bytes(eng), sum(fp16))
  got = list(eng.generate(prompt, 6))  # the prompt's keys and values reused, the last token run again
  assert_greedy_matches(ref, logits, got)

def test_chunk_size_classes_match_reference(model, rng):
  """The GPU's layout of prefill: a large chunk while more than engine.SMALL_CHUNK_MAX tokens are left, then small
  chunks (both float16 matrix steps, as on a GPU with tensor cores), against the reference that rounds as they do
  (Reference(float16=True); the float64 one differed by 9.4% at one seed's last position, where that rounding alone
  moves it by 9.6%: tests/reference.py), then decode."""
  from orin_llm import engine as E
  path, _ = model
  if "q4_0" in path.name or "q4_1" in path.name: pytest.skip("two cases cover the path; compiling costs CI time")
  eng = Engine(path, max_context=CONTEXT, chunk=64)
  assert eng.chunks == [E.SMALL_CHUNK, 64]
  prompt = rng.integers(0, VOCAB, E.SMALL_CHUNK_MAX + 64 + int(rng.integers(1, E.SMALL_CHUNK))).tolist()
  plan = eng.chunk_plan(len(prompt))
  assert set(plan) == {64, E.SMALL_CHUNK}, plan  # both classes, the last small chunk padded
  ref = Reference(path, float16=True)
  want = ref.run(prompt)
  next(iter(eng.generate(prompt, 1)))
  assert rel_err(eng.state.logits[0].numpy(), want) < 1e-2
  assert_greedy_matches(ref, want, list(eng.generate(prompt, 6)))

def test_mixed_types_fuse_the_runs_that_share_one(tmp_path, rng):
  """llama-quantize's Q4_K_M keeps attn_v and ffn_down of some layers in Q6_K (synth.llama_quantize_types: here layer 1
  of 2). There Q and K still run as one product (attn_q+attn_k) and V as another. In one sum tinygrad fuses V's product
  into the kernel storing the new keys and values: a decode step runs as many kernels as a file of one type's; in the
  affine form (quant.AFFINE) V's product gets a kernel of its own (model.Fused): one more. Logits against the
  float64 reference."""
  from tinygrad.uop.ops import Ops
  from orin_llm.model import fused_groups
  from orin_llm.synth import llama_quantize_types
  shape = preset("tiny-llama")
  main, types = llama_quantize_types(shape, "Q4_K_M")
  assert types.get("blk.1.attn_v.weight") == QT.Q6_K and "blk.0.attn_v.weight" not in types
  mixed = write_model(tmp_path / "q4_k_m.gguf", shape, main, LLAMA_VOCAB, seed=seed_for("q4_k_m"), types=types, vocab_size=VOCAB)
  plain = write_model(tmp_path / "q4_k.gguf", shape, main, LLAMA_VOCAB, seed=seed_for("q4_k_m"), types={"token_embd.weight": QT.Q6_K}, vocab_size=VOCAB)
  qtypes = {f"blk.{i}.{m}.weight": QT.Q6_K if f"blk.{i}.{m}.weight" in types else main
            for i in range(2) for m in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")}
  assert fused_groups(shape, qtypes) == {
    "blk.0.attn_qkv.weight": ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"],
    "blk.0.ffn_gate_up.weight": ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"],
    "blk.1.attn_q+attn_k.weight": ["blk.1.attn_q.weight", "blk.1.attn_k.weight"],
    "blk.1.ffn_gate_up.weight": ["blk.1.ffn_gate.weight", "blk.1.ffn_up.weight"]}
  def kernels(eng) -> int:
    linear, _ = eng.steps.one_decode(eng.v_pos.bind(5), eng.v_slot.bind(0)).linear_with_vars()
    return sum(c.op is Ops.CALL and c.src[0].op is Ops.SINK for c in linear.src)
  from orin_llm import quant
  eng = Engine(mixed, max_context=CONTEXT, chunk=8)
  assert kernels(eng) == kernels(Engine(plain, max_context=CONTEXT, chunk=8)) + int(QT.Q6_K in quant.AFFINE)
  ref = Reference(mixed)
  prompt = rng.integers(0, VOCAB, 9).tolist()
  for t in prompt[:-1]: ref.step(t)
  assert rel_err(eng.forward(prompt, 0), ref.step(prompt[-1])) < 1e-2
  for t in rng.integers(0, VOCAB, 3).tolist():
    assert rel_err(eng.forward([t], len(eng.cached)), ref.step(t)) < 1e-2

@pytest.mark.parametrize("raw", ["abc", "-16", "24", "65552", "", "8.5"])
def test_chunk_split_refuses_what_is_not_a_part_length(raw):
  """ORIN_LLM_CHUNK_SPLIT (the small chunks' split products, an experiment's knob): a bound and a one-line error."""
  from orin_llm.errors import OrinError
  from orin_llm.quant import chunk_split
  with pytest.raises(OrinError, match="ORIN_LLM_CHUNK_SPLIT"): chunk_split({"ORIN_LLM_CHUNK_SPLIT": raw})
  assert chunk_split({}) == 256 and chunk_split({"ORIN_LLM_CHUNK_SPLIT": "0"}) == 0 and chunk_split({"ORIN_LLM_CHUNK_SPLIT": "512"}) == 512

def test_split_parts_of_the_gpu_chunks():
  """The GPU's chunks (32 and 512 rows) over the 1B's and the 8B's reductions: parts of 256 for 32 rows; for 512 rows
  parts of 2048 (4 x rows), so that only the long ffn_down splits, its partial sums half the bytes of its weights."""
  from orin_llm import quant
  if quant.SPLIT_LEN != 256: pytest.skip("ORIN_LLM_CHUNK_SPLIT is set")
  assert [quant.split_parts(32, k) for k in (2048, 8192, 14336)] == [8, 32, 56]
  assert [quant.split_parts(512, k) for k in (2048, 4096, 8192, 14336, 6144)] == [1, 2, 4, 7, 3]
  assert quant.split_parts(512, 3000) == 1 and quant.split_parts(2048, 8192) == 1

def test_qwen3_decode_kernels_beside_llama(tmp_path):
  """Qwen3's decode step runs at most two kernels a layer more than LLaMA's (same shapes): the Q/K norms' one reduction
  over queries and keys together, and its queries rotated in one kernel (neox pairs, apply_rope). A norm each and the
  rotation in two halves made it four (492 kernels a token for Qwen3-1.7B, 436 after; docs/PERF.md)."""
  from tinygrad.helpers import GlobalCounters
  counts = {}
  for pre, vocab in (("tiny-llama", LLAMA_VOCAB), ("tiny-qwen3", QWEN_VOCAB)):
    eng = Engine(write_model(tmp_path / f"{pre}.gguf", preset(pre), QT.Q4_K, vocab, vocab_size=512), max_context=64)
    eng.profile_step().realize()
    GlobalCounters.reset()
    eng.profile_step().realize()
    counts[pre] = GlobalCounters.kernel_count
  assert counts["tiny-qwen3"] <= counts["tiny-llama"] + 2 * preset("tiny-qwen3").n_layers, counts

def test_neox_rotation_against_numpy(rng):
  """apply_rope's two pairings against float64 numpy: neox rotates (i, i + d/2), llama (2i, 2i + 1)."""
  from tinygrad import Tensor
  from orin_llm.model import apply_rope
  N, H, D = 3, 4, 16
  x, ang = rng.standard_normal((N, H, D)), rng.uniform(-7, 7, (N, 1, D // 2))
  for neox in (True, False):
    got = apply_rope(Tensor(x.astype(np.float32)), Tensor(np.cos(ang).astype(np.float32)), Tensor(np.sin(ang).astype(np.float32)), neox).numpy()
    if neox: x0, x1 = x[..., :D // 2], x[..., D // 2:]
    else: x0, x1 = x[..., 0::2], x[..., 1::2]
    y0, y1 = x0 * np.cos(ang) - x1 * np.sin(ang), x0 * np.sin(ang) + x1 * np.cos(ang)
    want = np.concatenate([y0, y1], -1) if neox else np.stack([y0, y1], -1).reshape(N, H, D)
    assert np.abs(got - want).max() < 1e-5, neox
