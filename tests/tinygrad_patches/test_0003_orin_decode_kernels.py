"""0003-matvec-heuristic on orin_llm's own decode kernels: a synthetic tiny-llama model is loaded on CPU, one
decode step (`Engine.steps.one_decode` at a bound start_pos and slot) is scheduled without being realized, and each kernel is
optimized by hand_coded_optimizations for a CUDA renderer (constructed without a GPU, as in
test_0003_matvec_heuristic.py). Every kernel that multiplies by a QuantWeight (fused Q/K/V, attention output,
fused gate/up, down, output head) must get the matvec opts GROUP / LOCAL 4 / UPCAST 4; no other kernel of the
step (embedding lookup, norms, RoPE and cache write, attention over the cache, softmax, argmax) may get a GROUP.

Threads per row: the patch reduces each row with 32 threads on NVIDIA, taken from the leading reduce ranges: the
largest divisor of 32 that divides the first one, and where that takes the whole range, the rest from the next.
Which ranges come first depends on how tinygrad splits the reduce to index the planes and the input:
- Q4_K: the reduce over K is split into (K/8 words, 8 nibbles): K/8 = 32 or 64 here, so GROUP 32, except for the
  attention output, whose input is indexed by (KV head, query head of the group, head_dim) (the softmax
  denominator is a column next to each head's values, so the heads are not contiguous): (2, 2, 8 words, 8).
- Q6_K: the sub-block scales (plane `sc`, four 8-bit scales of 16 elements to a word) and the 2-bit plane
  (`qh2`, read by one sum as words of 16) make tinygrad split the reduce into (K/64 sc words, 4 scale bytes, 2, 8 nibbles), and
  the range simplifier cannot merge them back: (4, 4, 2, 8) for K=256 and (8, 4, 2, 8) for K=512 (down), so
  GROUP 4, 4, 2 and GROUP 8, 4. At real sizes K/64 is >= 32 for K a multiple of 2048 (Llama 3.2 1B): GROUP 32.
Stock tinygrad gives none of them a GROUP (their reduce source is no MUL of two plain loads): the Q4_K ones get
GROUPTOP 16, the Q6_K ones UNROLL(3, 0) and LOCAL(0, 32) (one thread per row), some with UPCAST(0, 4) first."""
import math
import pytest
from gguf import GGMLQuantizationType as QT
from tinygrad.codegen import full_rewrite_to_sink
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import CUDARenderer
from tinygrad.uop.ops import Ops
from conftest import LLAMA_VOCAB
from orin_llm.model import SEGMENTS, row_columns
from orin_llm.engine import Engine
from orin_llm.quant import QuantWeight
from orin_llm.synth import write_model, preset

# these tests pin 0003's (and 0013's, 0017's) opts: 0020's unroll of the innermost range is off here, and a single
# row's product is one sum (0039's affine form is test_0039's)
pytestmark = pytest.mark.usefixtures("without_inner_unroll", "one_sum")

POS = 10

def cuda(): return CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)  # nvcc: no libnvrtc needed to construct

def matvec_opts(groups: tuple[int, ...]) -> tuple[Opt, ...]:
  return tuple(Opt(OptOps.GROUP, 0, g) for g in groups) + (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 4))

# the GROUPs (threads per row, over the leading reduce ranges) of each matvec of tiny-llama (dim 256, ffn 512,
# vocab 2048), see the docstring
THREADS = {QT.Q4_K: {"qkv": (32,), "attn_output": (2, 2, 8), "gate_up": (32,), "ffn_down": (32,), "output": (32,)},
           QT.Q6_K: {"qkv": (4, 4, 2), "attn_output": (4, 4, 2), "gate_up": (4, 4, 2), "ffn_down": (8, 4), "output": (4, 4, 2)}}

def decode_kernels(eng: Engine) -> list[tuple[set[str], set[str], object]]:
  """(matrices whose planes the kernel reads, other named buffers it reads or writes, its AST) for every kernel of one
  decode step. Matrices: 'blk.i.qkv', 'blk.i.attn_output', 'blk.i.gate_up', 'blk.i.ffn_down', 'token_embd'."""
  m = eng.model
  plane_of: dict = {}
  def planes(name: str, w): plane_of.update({p.uop.base: name for p in w.planes.values()})
  planes("token_embd", m.embd)
  if m.output is not m.embd: planes("output", m.output)
  for i, b in enumerate(m.blocks):
    for name, fused in (("qkv", b.qkv), ("gate_up", b.gate_up)):
      assert len(fused.parts) == 1, f"{name} of layer {i} is not fused"
      planes(f"blk.{i}.{name}", fused.parts[0])
    planes(f"blk.{i}.attn_output", b.wo); planes(f"blk.{i}.ffn_down", b.down)
  other = {eng.state.next_tok.uop.base: "tok_buf", m.rope.uop.base: "rope"} | {b.cache.uop.base: f"blk.{i}.cache" for i, b in enumerate(m.blocks)}
  linear, var_vals = eng.steps.one_decode(eng.v_pos.bind(POS), eng.v_slot.bind(0)).linear_with_vars()
  assert var_vals.get("start_pos") == POS and set(var_vals) <= {"start_pos", "slot"}
  # the attention's segment sums (model.Block.attend_rows), as the kernel combining them reads them
  sums = eng.cfg.n_heads * SEGMENTS * row_columns(eng.cfg.head_dim)
  out = []
  for call in linear.src:
    assert call.op is Ops.CALL and call.src[0].op is Ops.SINK
    bufs = [s.base for s in call.src[1:]]
    named = {other[b] for b in bufs if b in other} | ({"segment_sums"} if any(math.prod(b.shape) == sums for b in bufs[1:]) else set())
    out.append(({plane_of[b] for b in bufs if b in plane_of}, named, call.src[0]))
  return out

@pytest.fixture(scope="module", params=[QT.Q6_K, QT.Q4_K], ids=lambda q: q.name)
def model(request, tmp_path_factory):
  qt = request.param
  path = write_model(tmp_path_factory.mktemp("mv") / f"tiny-llama-{qt.name}.gguf", preset("tiny-llama"), qt, LLAMA_VOCAB,
                     seed=0, vocab_size=2048)
  eng = Engine(path, max_context=128, device="CPU")
  assert all(w.qtype == qt for w in eng.weights.values() if isinstance(w, QuantWeight))
  kernels = [(mats, other, ast, full_rewrite_to_sink(ast, cuda()).arg.applied_opts) for mats, other, ast in decode_kernels(eng)]
  for mats, other, _, opts in kernels: print(sorted(mats), sorted(other), opts)
  return qt, eng, kernels

def matvecs(kernels) -> dict[str, tuple[Opt, ...]]:
  """matrix -> opts of the kernel that multiplies by it (the output head multiplies by token_embd: tied)"""
  ret = {}
  for mats, other, _, opts in kernels:
    if mats and "tok_buf" not in other:  # tok_buf: the embedding lookup, rows gathered from token_embd's planes
      assert len(mats) == 1, mats
      [name] = mats
      assert name not in ret, f"two kernels multiply by {name}"
      ret["output" if name == "token_embd" else name] = opts
  return ret

def test_every_matvec_kernel_is_found(model):
  qt, eng, kernels = model
  names = {f"blk.{i}.{n}" for i in range(eng.cfg.n_layers) for n in ("qkv", "attn_output", "gate_up", "ffn_down")} | {"output"}
  assert set(matvecs(kernels)) == names

def test_matvec_kernels_get_warp_per_row_opts(model):
  qt, eng, kernels = model
  got = matvecs(kernels)
  want = {name: matvec_opts(THREADS[qt][name.split(".")[-1]]) for name in got}
  assert got == want

def test_other_kernels_get_no_matvec_opts(model):
  qt, eng, kernels = model
  rest = [(sorted(mats), sorted(other), opts) for mats, other, _, opts in kernels if not mats or "tok_buf" in other]
  # those that reduce: embedding gather, norms' sums of squares, attention scores over the cache, softmax max and
  # sum, probabilities times V, argmax. Attention over the cache batches n_heads/n_kv_heads query rows per KV head:
  # a matmul to the patch, left alone. But the kernel combining the segment sums: each of n_heads * row_columns rows
  # of them (a column per segment) times the segments' weights, a matvec to the patch, as at real sizes before the
  # sums were laid out columns first (then a tiny model's rows did not divide by 16)
  assert sum(any(u.op is Ops.REDUCE for u in ast.toposort()) for mats, other, ast, _ in kernels
             if not mats or "tok_buf" in other) >= 5 * eng.cfg.n_layers
  # Since 0031 the scores over the cache take a GROUP too, on a head's dimension (UNROLL 2, GROUP 16 first): a head's
  # dot products, not a matvec
  heads = lambda opts: [(o.op, o.axis, o.arg) for o in opts[:2]] == [(OptOps.UNROLL, 0, 2), (OptOps.GROUP, 0, 16)]
  # Since 0042 a sum to one value (a norm's sum of squares) adds a GROUP of 4 to its GROUPTOP of 16: no matvec either
  one = lambda opts: [(o.op, o.arg) for o in opts] == [(OptOps.GROUPTOP, 16), (OptOps.GROUP, 4)]
  assert [k for k in rest if any(o.op is OptOps.GROUP for o in k[2]) and "segment_sums" not in k[1] and not heads(k[2]) and not one(k[2])] == []
  assert sum(heads(k[2]) for k in rest) == eng.cfg.n_layers  # one scores kernel a layer
