"""The two attention forms of model.Block against float64 numpy softmax attention, on random queries and a random
KV cache: decode rows split over key segments (attend_rows, flash-decoding's split), and a prefill chunk's
matrix form (attend_chunk). Query positions are drawn at, around and away from multiples of the segment (SEGMENT
keys) and of the blocks (ROW_BLOCK, KV_BLOCK); the cache past each row's position holds large random values
(another conversation's keys and values), which the mask must keep out."""
import math
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from orin_llm.model import Block, KV_BLOCK, ROW_BLOCK, SHORT_BLOCK, SEGMENT, SEGMENTS, kv_capacity, row_columns

KV, G, D = 2, 3, 16  # kv heads, query heads per kv head, head dim

def reference(q: np.ndarray, cache: np.ndarray, qpos: np.ndarray, slot0: int) -> np.ndarray:
  """q (B, KV, g, T, D); cache (L, slots, 2, KV, D); qpos (B, T) -> (B, KV, g, T, D), float64."""
  B, _, g, T, _ = q.shape
  out = np.zeros(q.shape)
  for b in range(B):
    for t in range(T):
      n = qpos[b, t] + 1
      k, v = cache[:n, slot0 + b, 0].astype(np.float64), cache[:n, slot0 + b, 1].astype(np.float64)  # (n, KV, D)
      for h in range(KV):
        s = q[b, h, :, t].astype(np.float64) @ k[:, h].T / math.sqrt(D)  # (g, n)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[b, h, :, t] = (p / p.sum(-1, keepdims=True)) @ v[:, h]
  return out

def run(rng, qpos: np.ndarray, rows: bool, slots: int = 1, slot0: int = 0, block: int = ROW_BLOCK):
  B, T = qpos.shape
  L = kv_capacity(int(qpos.max()) + 1)
  cache = rng.standard_normal((L, slots, 2, KV, D)).astype(np.float16)
  for b in range(B):  # past each sequence's last position: another sequence's values, large enough to show a leak
    cache[qpos[b].max() + 1:, slot0 + b] = (rng.standard_normal(cache[qpos[b].max() + 1:, slot0 + b].shape) * 300).astype(np.float16)
  q = (rng.standard_normal((B, KV, G, T, D)) * 2).astype(np.float32)
  size = block if rows else KV_BLOCK
  nb = (int(qpos.max()) + 1 + size - 1) // size
  kv = Tensor(cache).reshape(-1, size, slots, 2, KV, D)[0:nb, :, slot0:slot0 + B]  # as Block.attention passes it
  pos = Tensor(np.arange(L, dtype=np.int32))
  args = (Tensor(q), kv, nb, pos, Tensor(qpos.astype(np.int32)), 1.0 / math.sqrt(D))
  got = (Block.attend_rows(None, *args) if rows else Block.attend_chunk(None, *args)).numpy()
  want = reference(q, cache, qpos, slot0)
  err = np.abs(got - want).max() / np.abs(want).max()
  assert err < (2e-3 if rows else 2e-2), (qpos.tolist(), err)  # the chunk multiplies in float16, as llama.cpp does

# single rows at lengths that are and are not multiples of a segment and of a block, one sequence in a later slot
@pytest.mark.parametrize("length", [1, SEGMENT, SEGMENT + 1, ROW_BLOCK - 1, ROW_BLOCK, ROW_BLOCK + SEGMENT + 3])
def test_decode_row_split_equals_plain(rng, length):
  run(rng, np.array([[length - 1]]), rows=True, slots=3, slot0=1)

# the short steps' blocks (model.SHORT_BLOCK: 32 segments of 8 keys), at and around their edges and past several
@pytest.mark.parametrize("length", [1, SEGMENT + 1, SHORT_BLOCK - 1, SHORT_BLOCK, SHORT_BLOCK + 1, 3 * SHORT_BLOCK + SEGMENT + 5])
def test_decode_row_in_short_blocks_equals_plain(rng, length):
  run(rng, np.array([[length - 1]]), rows=True, slots=3, slot0=1, block=SHORT_BLOCK)

def test_decode_rows_of_several_sequences_in_short_blocks(rng):
  n = rng.integers(1, 3 * SHORT_BLOCK, 4)
  n[0] = 1
  run(rng, (n - 1).reshape(4, 1), rows=True, slots=4, block=SHORT_BLOCK)

def test_decode_rows_of_several_sequences(rng):
  """A batch: rows of different lengths over the same block count, the short ones with whole segments and blocks
  masked (their maxima the finite MASKED score, their weight 0)."""
  n = rng.integers(1, 2 * ROW_BLOCK, 3)
  n[0] = 1
  run(rng, (n - 1).reshape(3, 1), rows=True, slots=4)

def test_verify_rows(rng):
  """Several rows of one sequence (speculative decoding's verify step), causal among themselves."""
  start = int(rng.integers(0, ROW_BLOCK))
  run(rng, (start + np.arange(5)).reshape(1, 5), rows=True)

def test_prompt_rows_of_several_sequences(rng):
  """Several sequences' prompt rows together (Steps.group): 8 rows each of 3 sequences at their own starts, causal
  within each; 24 rows take fewer, longer segments (model.row_segments) than a decode row's."""
  from orin_llm.model import row_segments
  assert row_segments(24) < SEGMENTS or SEGMENTS == 1
  starts = rng.integers(0, 2 * ROW_BLOCK - 8, 3)
  run(rng, starts.reshape(3, 1) + np.arange(8).reshape(1, 8), rows=True, slots=4)

@pytest.mark.parametrize("parts", [1, 4, KV_BLOCK // 16])
def test_chunk_matrix_form(rng, monkeypatch, parts):
  """A prefill chunk of 32 rows from a random start: the float16 matrix form, over a block boundary, its product with
  V whole and split into runs of keys inside each block (model.PV_PARTS), down to runs of 16."""
  from orin_llm import model
  monkeypatch.setattr(model, "PV_PARTS", parts)
  start = int(rng.integers(KV_BLOCK - 32, KV_BLOCK)) + KV_BLOCK * int(rng.integers(0, 3))
  run(rng, (start + np.arange(32)).reshape(1, 32), rows=False)

def test_chunk_matrix_form_of_several_sequences(rng):
  """Several sequences' prompt chunks side by side (Steps.group on a GPU): 32 rows each of 3 sequences at their own
  starts, in slots 1-3, each attending to its own slot's keys only."""
  starts = rng.integers(0, 3 * KV_BLOCK - 32, 3)
  run(rng, starts.reshape(3, 1) + np.arange(32).reshape(1, 32), rows=False, slots=4, slot0=1)

def test_chunk_pv_parts_stay_apart():
  """The split of the chunk's product with V must survive scheduling: the parts' float32 sums, (PV_PARTS, KV, g*T,
  D + DENOM_COLUMNS), are written out by the product and added after. As one expression tinygrad folds the parts' sum
  back into the product's reduction: one serial walk over every key per output tile (139 us a layer for the 1B's chunk
  of 512 at position 1536 against 62 split, H200, docs/PERF.md nineteenth session)."""
  from tinygrad import UOp
  from tinygrad.uop.ops import Ops
  from orin_llm.model import DENOM_COLUMNS, PV_PARTS
  if PV_PARTS == 1: pytest.skip("ORIN_LLM_CHUNK_PV_PARTS=1: no split")
  T, L = 32, 4 * KV_BLOCK
  cache = Tensor.empty(L, 1, 2, KV, D, dtype=dtypes.float16)
  nb = UOp.variable("blocks", 1, L // KV_BLOCK).bind(3)
  q, qpos = Tensor.empty(1, KV, G, T, D), Tensor.empty(1, T, dtype=dtypes.int32)
  out = Block.attend_chunk(None, q, cache.reshape(-1, KV_BLOCK, 1, 2, KV, D)[0:nb], nb, Tensor.arange(L, dtype=dtypes.int32), qpos, 0.25)
  linear, _ = out.linear_with_vars()
  written = [(math.prod(call.src[1].shape), call.src[1].dtype) for call in linear.src if call.op is Ops.CALL and call.src[0].op is Ops.SINK]
  assert (PV_PARTS * KV * G * T * (D + DENOM_COLUMNS), dtypes.float32) in written, written

def test_segment_sums_stay_a_kernel_of_their_own():
  """The split must survive scheduling: each segment's exp-weighted sum of V with columns of ones is written out as
  (C, B, KV, g, T, SEGMENTS), C = model.row_columns(D), and another kernel combines the segments. Left as one expression, tinygrad fused the sums and
  their combination into one reduction over every key, a few thousand threads each walking the whole context (the
  8B's head_dim 128: 1263 us a layer at depth 4000 with the hand-coded opts, H100, docs/PERF.md)."""
  from tinygrad import UOp
  from tinygrad.uop.ops import Ops
  B, T, L = 2, 1, 4 * ROW_BLOCK
  cache = Tensor.empty(L, B, 2, KV, D, dtype=dtypes.float16)
  nb = UOp.variable("blocks", 1, L // ROW_BLOCK).bind(3)
  q, qpos = Tensor.empty(B, KV, G, T, D), Tensor.empty(B, T, dtype=dtypes.int32)
  out = Block.attend_rows(None, q, cache.reshape(-1, ROW_BLOCK, B, 2, KV, D)[0:nb], nb, Tensor.arange(L, dtype=dtypes.int32), qpos, 0.25)
  linear, _ = out.linear_with_vars()
  written = [math.prod(call.src[1].shape) for call in linear.src if call.op is Ops.CALL and call.src[0].op is Ops.SINK]
  assert B * KV * G * T * SEGMENTS * row_columns(D) in written, written

def cache_param(call, size: int) -> str:
  """A regex of the start of an address in the call's KV cache parameter, in its rendered source: a parameter is named by its slot
  (tinygrad patch 0024), its place among the call's buffers (output first)."""
  slots = [str(i) for i, b in enumerate(call.src[1:]) if math.prod(b.shape) == size]
  assert slots, "the call reads no buffer of the cache's size"
  return rf"\(data({'|'.join(slots)})\+"

def cuda_render(ast) -> tuple[tuple, str, str]:
  """(applied opts, name, CUDA source) of a kernel optimized by the hand-coded opts for an Orin's CUDA renderer,
  constructed without a GPU (nvcc's: no CUDA library needed)."""
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  pm = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                       (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])
  sink = full_rewrite_to_sink(ast, ren)
  prg = graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), pm, ctx=ren)
  return sink.arg.applied_opts, sink.arg.name, prg.src[-1].arg

def test_chunk_attention_kernels(tmp_path, monkeypatch):
  """A prefill chunk's attention in the engine's own graph (its block count an expression of start_pos), each kernel
  optimized by the hand-coded opts for a CUDA renderer (constructed without a GPU) and rendered:
  - the scores kernel runs on tensor cores and stores its output in vectors along the keys. With the queries
    (KV, g*T) and the scores reshaped to (KV, g, T, ...) after the product, every load's index was a division by
    the block count and mentioned every range, so no tensor core applied (the kernel BEAM then searched for 60 s:
    9.0 ms hand-coded, 1.36 ms found, 1B 512-row chunk at mid context, H100, docs/PERF.md ninth session);
  - the float16 probabilities are read once, by the product with V (with its columns of ones: the denominator),
    on tensor cores; a sum of its own read them again (147 us a layer for that chunk)."""
  from tinygrad.uop.ops import Ops
  from conftest import LLAMA_VOCAB
  from orin_llm import quant
  from orin_llm.engine import Engine
  from orin_llm.model import Rows
  from orin_llm.synth import write_model, preset
  T, POS = 64, 300
  monkeypatch.setattr(quant, "MATMUL_ROWS", 32)
  path = write_model(tmp_path / "tiny.gguf", preset("tiny-llama"), quant.QT.Q4_K, LLAMA_VOCAB, seed=0, vocab_size=2048)
  eng = Engine(path, max_context=1024, chunk=T, device="CPU")
  st, cfg, pos = eng.state, eng.cfg, eng.v_pos.bind(POS)
  out = st.logits[0:1].assign(eng.model(st.prompt[pos:pos + T], Rows((pos,), T, eng.v_slot.bind(0)), eng.v_len.bind(T)))
  calls = [c for c in out.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]
  render = lambda ast: cuda_render(ast)[::2]  # (opts, source)
  # scores and probabilities: a value per query head, row and key of the chunk's whole KV_BLOCKs up to the context and
  # the chunk (not the cache's capacity, which rounds to the decode form's longer blocks as well)
  per_layer = cfg.n_heads * T * -(-(eng.max_context + T) // KV_BLOCK) * KV_BLOCK
  scores = [c for c in calls if math.prod(c.src[1].shape) == per_layer and c.src[1].dtype == dtypes.float32]
  assert len(scores) == cfg.n_layers, "one kernel a layer writes the float32 scores"
  opts, src = render(scores[0].src[0])
  assert any(o.op.name == "TC" for o in opts), opts
  stores = [l for l in src.splitlines() if l.strip().startswith("*(") and "data0" in l.split("=")[0]]
  assert stores and all(l.strip().startswith("*((float") for l in stores), stores[:4]
  # the probabilities: what a kernel reading the scores writes in float16
  [probs] = [c.src[1] for c in calls if c.src[1].dtype == dtypes.float16 and any(b is scores[0].src[1] for b in c.src[2:])]
  readers = [c for c in calls if any(b is probs for b in c.src[2:])]
  assert len(readers) == 1 and any(o.op.name == "TC" for o in render(readers[0].src[0])[0]), len(readers)
  # the product with V's parts are read once, by the kernel that adds them, divides by the denominator and writes the
  # output projection's float16 input (a sum over the parts' axis was a kernel of its own, writing float32 sums that the
  # division read again: 20 us a layer in the 1B's chunk of 512, H200)
  parts = readers[0].src[1]
  [div] = [c for c in calls if any(b is parts for b in c.src[2:])]
  assert div.src[1].dtype == dtypes.float16 and math.prod(div.src[1].shape) == T * cfg.n_heads * cfg.head_dim, div.src[1]
  # SiLU(gate) * up is written once, in float16, as the down projection reads it: no float32 buffer of it cast by a
  # kernel of its own (37.6 us a layer in that chunk)
  gate_up = [c.src[1] for c in calls if math.prod(c.src[1].shape) == T * 2 * cfg.ffn_dim and c.src[1].dtype == dtypes.float32]
  assert len(gate_up) == cfg.n_layers, len(gate_up)
  for b in gate_up:
    [act] = [c.src[1] for c in calls if any(x is b for x in c.src[2:])]
    assert act.dtype == dtypes.float16 and math.prod(act.shape) == T * cfg.ffn_dim, act

def test_cache_reads_need_no_division(tmp_path, monkeypatch):
  """Every kernel of a decode step, a verify step and a prefill chunk that reads the KV cache computes its addresses with no
  division or modulo by a runtime value: the attention takes the cache in blocks of constant size, and only then
  the first nb of them (nb an expression of start_pos). Sliced to nb * block rows first and split into blocks
  after, each of the segment sums' 8 loads of V a step took a modulo by nb * 32 (CUDA source rendered on the CPU)."""
  import re
  from tinygrad.uop.ops import Ops
  from conftest import LLAMA_VOCAB
  from orin_llm import quant
  from orin_llm.engine import Engine
  from orin_llm.model import Rows
  from orin_llm.synth import write_model, preset
  path = write_model(tmp_path / "tiny.gguf", preset("tiny-llama"), quant.QT.Q4_K, LLAMA_VOCAB, seed=0, vocab_size=2048)
  eng = Engine(path, max_context=1024, device="CPU", max_batch=2)
  st, pos, slot = eng.state, eng.v_pos.bind(700), eng.v_slot.bind(1)
  cache_size = math.prod(eng.model.blocks[0].cache.shape)
  monkeypatch.setattr(quant, "MATMUL_ROWS", 32)
  for T in (1, 4, 64):  # decode, a verify step of 4 rows, a prefill chunk (the matrix form, as on a GPU)
    out = eng.model(st.prompt[pos:pos + T] if T > 1 else st.next_tok[0:1], Rows((pos,), T, slot), all_rows=T > 1)
    readers = [c for c in out.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK and
               any(math.prod(b.shape) == cache_size for b in c.src[2:])]
    assert len(readers) >= 2 * eng.cfg.n_layers, len(readers)  # keys and values, each layer
    for c in readers:
      _, name, src = cuda_render(c.src[0])
      loads = [l for l in src.splitlines() if re.search(cache_param(c, cache_size), l) and "=" in l]
      assert loads and not any(re.search(r"[/%]\s*\(?(alu|data)", l) for l in loads), (T, name, [l for l in loads if "%" in l or "/" in l][:3])

def test_segment_sums_read_v_in_vectors(tmp_path):
  """The decode step's segment sums, optimized by the hand-coded opts for a CUDA renderer (constructed without a GPU),
  load V in 8-byte vectors, 4 consecutive columns a thread: the sums are written columns first and V's columns padded
  to a multiple of 16 that is not one of 3 (model.row_columns). Laid out (B, KV, g, T, S, D + 1), every load was one
  2-byte value, a warp's threads reading 32 rows or heads apart, each column a thread block of its own (1B: 32.1 us a
  layer timed alone at depth 4000, H100, docs/PERF.md eighth session)."""
  import re
  from tinygrad.uop.ops import Ops
  from conftest import LLAMA_VOCAB
  from orin_llm import quant
  from orin_llm.engine import Engine
  from orin_llm.synth import write_model, preset
  path = write_model(tmp_path / "tiny.gguf", preset("tiny-llama"), quant.QT.Q4_K, LLAMA_VOCAB, seed=0, vocab_size=2048)
  eng = Engine(path, max_context=1024, device="CPU")
  cfg = eng.cfg
  linear, _ = eng.steps.one_decode(eng.v_pos.bind(700), eng.v_slot.bind(0)).linear_with_vars()
  size = cfg.n_heads * SEGMENTS * row_columns(cfg.head_dim)
  sums = [c for c in linear.src if c.op is Ops.CALL and c.src[0].op is Ops.SINK and math.prod(c.src[1].shape) == size]
  assert len(sums) == cfg.n_layers, len(sums)
  opts, _, src = cuda_render(sums[0].src[0])
  cache = math.prod(eng.model.blocks[0].cache.shape)
  loads = [l.strip() for l in src.splitlines() if re.search(cache_param(sums[0], cache), l) and "=" in l]
  assert loads and all(l.startswith("half4 ") for l in loads), (opts, loads[:4])

@pytest.mark.parametrize("raw", ["abc", "0", "-4", "1025", "", "8.5"])
def test_decode_segments_refuses_what_is_not_a_count(raw):
  """ORIN_LLM_DECODE_SEGMENTS (the decode attention's segments, an experiment's knob): a bound and a one-line error."""
  from orin_llm.errors import OrinError
  from orin_llm.model import decode_segments
  with pytest.raises(OrinError, match="ORIN_LLM_DECODE_SEGMENTS"): decode_segments({"ORIN_LLM_DECODE_SEGMENTS": raw})
  assert decode_segments({}) == 128 and decode_segments({"ORIN_LLM_DECODE_SEGMENTS": "32"}) == 32

@pytest.mark.parametrize("raw", ["abc", "-4", "", "8.5", str((1 << 24) + 1)])
def test_short_keys_refuses_what_is_not_a_bounded_count(raw):
  """ORIN_LLM_SHORT_KEYS (where the short steps stop): a bound and a one-line error."""
  from orin_llm.errors import OrinError
  from orin_llm.model import short_keys
  with pytest.raises(OrinError, match="ORIN_LLM_SHORT_KEYS"): short_keys({"ORIN_LLM_SHORT_KEYS": raw})
  assert short_keys({}) == 512 and short_keys({"ORIN_LLM_SHORT_KEYS": "0"}) == 0 and short_keys({"ORIN_LLM_SHORT_KEYS": "1024"}) == 1024

@pytest.mark.parametrize("raw", ["0", "3", "32", "-4", "four", ""])
def test_chunk_pv_parts_refuses_what_does_not_split_a_block(raw):
  """ORIN_LLM_CHUNK_PV_PARTS (the chunk's product with V in parts, an experiment's knob): a divisor of KV_BLOCK into
  runs of a multiple of 16 keys (the tensor cores' step), or a one-line error."""
  from orin_llm.errors import OrinError
  from orin_llm.model import chunk_pv_parts
  with pytest.raises(OrinError, match="ORIN_LLM_CHUNK_PV_PARTS"): chunk_pv_parts({"ORIN_LLM_CHUNK_PV_PARTS": raw})
  assert chunk_pv_parts({}) == 4 and chunk_pv_parts({"ORIN_LLM_CHUNK_PV_PARTS": "1"}) == 1 and chunk_pv_parts({"ORIN_LLM_CHUNK_PV_PARTS": "16"}) == 16

def test_rows_in_fewer_segments(rng, monkeypatch):
  """model.ROW_SEGMENT_BUDGET (rows x segments, at most; past it, group steps' rows take fewer segments): 8 rows of one
  sequence under a budget of SEGMENTS walk SEGMENTS / 8 longer segments of every block."""
  from orin_llm import model
  monkeypatch.setattr(model, "ROW_SEGMENT_BUDGET", SEGMENTS)
  assert model.row_segments(8) == max(1, SEGMENTS // 8) and model.row_segments(1) == SEGMENTS
  start = int(rng.integers(0, 2 * ROW_BLOCK - 8))
  run(rng, (start + np.arange(8)).reshape(1, 8), rows=True)

def test_verify_rows_in_the_matrix_form(rng, monkeypatch):
  """By default (model.ATTN_MATRIX_ROWS) a verify step's 8 rows of one sequence take the prefill chunk's matrix form,
  here from a random start over a block boundary; batches of decode rows (one a sequence) keep the rows' split."""
  from orin_llm import model
  assert model.ATTN_MATRIX_ROWS == model.DEFAULT_ATTN_MATRIX_ROWS == 4  # unset in the tests' environment
  assert model.attends_as_matrix(8) and model.attends_as_matrix(4) and not model.attends_as_matrix(1, 8)
  assert not model.attends_as_matrix(4, 4)  # several sequences' prompts of 4 rows (Steps.group on the CPU) keep theirs
  assert model.key_block(8) == KV_BLOCK
  start = int(rng.integers(KV_BLOCK - 8, KV_BLOCK)) + KV_BLOCK * int(rng.integers(0, 3))
  run(rng, (start + np.arange(8)).reshape(1, 8), rows=False)

@pytest.mark.parametrize("B", [1, 3])
def test_few_rows_with_merged_scores(rng, monkeypatch, B):
  """ORIN_LLM_MERGED_SCORES_ROWS (an experiment's knob): 4 rows a sequence (a verify step's, or several sequences'
  prompt rows) take the matrix form with the heads and rows one axis of the scores and the mask applied after them;
  against float64 numpy from random starts over a block boundary, short sequences' masked keys included."""
  from orin_llm import model
  monkeypatch.setattr(model, "MERGED_SCORES_ROWS", 8)
  starts = rng.integers(KV_BLOCK - 4, KV_BLOCK + 8, B) + KV_BLOCK * rng.integers(0, 2, B)
  run(rng, starts.reshape(B, 1) + np.arange(4).reshape(1, 4), rows=False, slots=B + 1)

def test_attention_knobs_refuse_what_is_not_a_count(monkeypatch):
  """ORIN_LLM_ATTN_MATRIX_ROWS and ORIN_LLM_MERGED_SCORES_ROWS: their defaults, bounds and one-line errors; each part of
  the steps file's key (steps compiled under another value are other programs)."""
  from orin_llm import model, step_cache
  from orin_llm.errors import OrinError
  knob = "ORIN_LLM_ATTN_MATRIX_ROWS"
  monkeypatch.setenv(knob, "16")
  assert step_cache._opts_env()[knob] == "16"
  for raw in ["0", "1", "x", "", "4.0"]:
    with pytest.raises(OrinError, match=knob): model.attn_matrix_rows({knob: raw})
  assert model.attn_matrix_rows({}) == model.DEFAULT_ATTN_MATRIX_ROWS and model.attn_matrix_rows({knob: "16"}) == 16
  monkeypatch.setenv("ORIN_LLM_MERGED_SCORES_ROWS", "8")
  assert step_cache._opts_env()["ORIN_LLM_MERGED_SCORES_ROWS"] == "8"
  for raw in ["x", "", "-1", "4.0"]:
    with pytest.raises(OrinError, match="ORIN_LLM_MERGED_SCORES_ROWS"): model.merged_scores_rows({"ORIN_LLM_MERGED_SCORES_ROWS": raw})
  assert model.merged_scores_rows({}) == 0 and model.merged_scores_rows({"ORIN_LLM_MERGED_SCORES_ROWS": "8"}) == 8
