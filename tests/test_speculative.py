"""Speculative decoding (speculative.py, Engine.verify): greedy output is the plain path's, a rejected proposal's keys
and values never leak into later tokens (rollback), and sampled verification keeps the target's distribution:
for both proposal sources, n-gram lookup and a draft model."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.engine import Engine
from orin_llm.sampling import Sampling
from orin_llm.speculative import NgramDraft, ModelDraft, Speculator
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB, seed_for

VOCAB = 2048

def test_ngram_proposals():
  d = NgramDraft(max_n=3)
  t = [5, 6, 7, 8, 9, 1, 2, 6, 7]
  assert d.propose(t, 3) == [8, 9, 1]  # "6 7" was followed by "8 9 1"
  assert d.propose(t + [8, 4, 6, 7], 2) == [8, 4]  # the newest occurrence of "6 7" wins (and the index grew)
  assert d.propose([1, 2, 3], 4) == []
  assert NgramDraft(min_n=1).propose([3, 3], 5) == [3]  # what is known after the last "3": one token
  assert NgramDraft().propose([4, 3, 5, 3], 5) == []  # a single token's match is not used by default (min_n=2)

@pytest.fixture(scope="module")
def models(tmp_path_factory):
  d = tmp_path_factory.mktemp("spec")
  target = write_model(d / "t.gguf", preset("tiny-llama"), QT.Q6_K, LLAMA_VOCAB, seed=seed_for("spec-target"), vocab_size=VOCAB)
  draft = write_model(d / "d.gguf", preset("tiny-llama", n_layers=1), QT.Q4_K, LLAMA_VOCAB, seed=seed_for("spec-draft"), vocab_size=VOCAB)
  # drafts: another random model (its proposals are rejected: rollback) and the target's own file (all accepted)
  return Engine(target, max_context=160, chunk=8), {"other": Engine(draft, max_context=160, chunk=8), "same": Engine(target, max_context=160, chunk=8)}

def plain(eng, prompt, n, s=Sampling()):
  eng.reset()
  return list(eng.generate(prompt, n, s, lookahead=4))

def same_but_for_ties(eng, prompt, got, want):
  """got equals want up to the first place where want's model has a near tie between the two choices."""
  for i, (a, b) in enumerate(zip(got, want)):
    if a != b:
      eng.reset()
      lg = eng.forward(prompt + want[:i], 0)
      assert abs(lg[a] - lg[b]) < 1e-3 * np.abs(lg).max(), (i, got, want)
      return
  assert len(got) == len(want)

@pytest.mark.parametrize("source", ["ngram", "draft-same", "draft-other"])
def test_greedy_output_is_the_plain_paths(models, rng, source):
  eng, drafts = models
  prompt = rng.integers(0, VOCAB, 12).tolist() * 3  # repeats: n-gram lookup finds proposals
  want = plain(eng, prompt, 40)
  if source == "ngram": sp = Speculator(NgramDraft())
  else:
    draft = drafts[source.split("-")[1]]
    draft.reset()
    sp = Speculator(ModelDraft(draft), patience=100)  # keep verifying even when nothing is accepted
  eng.reset()
  got = list(eng.generate(prompt, 40, Sampling(), speculator=sp))
  same_but_for_ties(eng, prompt, got, want)
  assert sp.steps > 0, sp.stats()
  if source != "draft-other": assert sp.accepted > 0, sp.stats()  # verify steps accepted something

@pytest.mark.parametrize("qtype,split_sums", [(QT.Q4_K, 1), (QT.Q6_K, 1), (QT.Q4_K, 0)], ids=["Q4_K", "Q6_K", "Q4_K-whole-sums"])
def test_greedy_output_with_the_tensor_core_form(tmp_path, rng, monkeypatch, qtype, split_sums):
  """ORIN_LLM_TC_ROWS=2 (quant.tc_product: a verify step's Q4_K products, and Q6_K's from 4 rows, with float16 weights,
  decode's in float32): greedy output with n-gram proposals is still the plain path's, up to near ties; the form did
  run inside verify steps, Q6_K's only in those of its floor's rows or more (quant.TC_TYPES). Both paths prefill with the knob on (chunks
  of 8 rows take the form too): verify is checked against decode. On the CPU, which has no tensor cores, the form's
  arithmetic is what runs, not its kernels' layout. quant.SPLIT_SUMS as by default (gate+up's members summed apart), and 0
  (summed whole)."""
  from orin_llm import quant
  monkeypatch.setattr(quant, "SPLIT_SUMS", split_sums)
  monkeypatch.setattr(quant, "TC_ROWS", 2)
  monkeypatch.setattr(quant, "TC_MIN_WEIGHTS", 0)  # the tiny model's matrices are all under the floor
  monkeypatch.setattr(quant, "has_tensor_cores", lambda device: True)  # the CPU's renderer has none
  path = write_model(tmp_path / f"{qtype.name}.gguf", preset("tiny-llama"), qtype, LLAMA_VOCAB, seed=seed_for(f"spec-tc-{qtype.name}"), vocab_size=VOCAB)
  eng = Engine(path, max_context=160, chunk=8)
  # the form's products built inside verify steps (prompt chunks of 8 rows take it too)
  calls, real, verifying = [], quant.tc_product, []
  members = []  # the products that summed their members apart (split_sums)
  monkeypatch.setattr(quant, "tc_product", lambda x, p, q, m=(): (verifying and calls.append(x.shape[0])) or (m and members.append(m)) or real(x, p, q, m))
  real_verify = eng.verify
  def verify(*a, **k):
    verifying.append(1)
    try: return real_verify(*a, **k)
    finally: verifying.pop()
  monkeypatch.setattr(eng, "verify", verify)
  prompt = rng.integers(0, VOCAB, 12).tolist() * 3
  want = plain(eng, prompt, 40)
  sp = Speculator(NgramDraft())
  eng.reset()
  got = list(eng.generate(prompt, 40, Sampling(), speculator=sp))
  same_but_for_ties(eng, prompt, got, want)
  assert calls and sp.accepted > 0, (calls, sp.stats())
  assert min(calls) >= max(2, quant.TC_TYPES[qtype]), calls  # under its type's floor, one sum
  assert bool(members) == bool(split_sums), members  # gate+up's two members, where the knob is on
  assert all(len(m) == 2 for m in members), members

@pytest.mark.parametrize("matrix_rows,merged", [(None, 0), (32, 0), (None, 8)])
def test_greedy_output_with_each_verify_attention(tmp_path, rng, monkeypatch, matrix_rows, merged):
  """The verify steps' rows attend in the prefill chunk's matrix form (model.ATTN_MATRIX_ROWS, default: float16
  products over blocks of KV_BLOCK keys, their count bound from the step's symbolic position), or with
  ORIN_LLM_ATTN_MATRIX_ROWS=32 in the rows' split (the rule before): greedy output with n-gram proposals is the plain
  path's up to near ties either way, and the form expected did run inside verify steps. The prompt's chunks of 8 rows
  take the matrix form by default, on both paths. With ORIN_LLM_MERGED_SCORES_ROWS=8 (an experiment's knob) the
  4-row verify steps' scores are one axis of heads and rows."""
  from orin_llm import model
  if matrix_rows: monkeypatch.setattr(model, "ATTN_MATRIX_ROWS", matrix_rows)
  monkeypatch.setattr(model, "MERGED_SCORES_ROWS", merged)
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q6_K, LLAMA_VOCAB, seed=seed_for("spec-matrix"), vocab_size=VOCAB)
  eng = Engine(path, max_context=600, chunk=8)
  forms, verifying = [], []
  for name in ("attend_chunk", "attend_rows"):
    def counted(self, q, *a, name=name, real=getattr(model.Block, name)):
      if verifying: forms.append((name, q.shape[3]))
      return real(self, q, *a)
    monkeypatch.setattr(model.Block, name, counted)
  real_verify = eng.verify
  def verify(*a, **k):  # the forms counted while a verify step is built, not a prompt chunk
    verifying.append(1)
    try: return real_verify(*a, **k)
    finally: verifying.pop()
  monkeypatch.setattr(eng, "verify", verify)
  prompt = rng.integers(0, VOCAB, 100).tolist() * 3  # past the first block of KV_BLOCK keys
  want = plain(eng, prompt, 40)
  sp = Speculator(NgramDraft())
  eng.reset()
  got = list(eng.generate(prompt, 40, Sampling(), speculator=sp))
  same_but_for_ties(eng, prompt, got, want)
  expected = "attend_rows" if matrix_rows else "attend_chunk"
  assert sp.accepted > 0 and forms and {f for f, _ in forms} == {expected}, (forms, sp.stats())
  assert {t for _, t in forms} <= {4, 8}, forms  # the verify steps' rows: proposals padded to 3 or 7

def test_rejected_proposals_roll_back(models, rng):
  """Wrong proposals: one token comes back (the plain path's), the slot caches only its input, and what the rejected
  rows wrote into the cache does not change any later token; right proposals are all accepted, plus one."""
  eng, _ = models
  prompt = rng.integers(0, VOCAB, 10).tolist()
  want = plain(eng, prompt, 12)
  eng.reset()
  assert eng.prefill(0, prompt) == want[0]
  wrong = [(want[1] + 1 + i) % VOCAB for i in range(6)]
  assert eng.verify(0, wrong) == [want[1]]
  assert eng.slots[0].cached == prompt + want[:1] and eng.slots[0].next == want[1]
  got = eng.verify(0, want[2:7])  # all right: 5 accepted and the one after them
  assert got == want[2:8], (got, want)
  rest = eng.decode([0], 4)[:, 0].tolist()  # plain steps over a cache the wrong rows wrote past
  assert want[:8] + rest == want[:12]

@pytest.mark.parametrize("source", ["ngram", "draft"])
def test_sampled_verification_keeps_the_distribution(models, rng, source):
  """Sampled verification, over many seeds: the token a verify step emits first is distributed as plain sampling's
  (softmax(l / T)), and the proposal is accepted as often as the target picks it."""
  eng, drafts = models
  draft = drafts["other"]
  prompt = rng.integers(0, VOCAB, 9).tolist()
  x = int(rng.integers(VOCAB))  # the last chosen token, fixed, so that every trial samples the same distribution
  T = 3.0  # flat enough that several tokens come up
  eng.reset()
  logits = eng.forward(prompt + [x], 0)
  p = np.exp((logits - logits.max()) / T); p /= p.sum()
  if source == "ngram": d = int(np.argsort(-p)[1])  # a proposal that is often but not always right
  else: draft.reset(); d = ModelDraft(draft).propose(prompt + [x], 1)[0]
  n, firsts, accepted = 500, [], 0
  for i in range(n):
    eng.prefill(0, prompt, Sampling(T, 0, 1.0, int(rng.integers(1 << 24))))  # the cached prompt: its last token runs again
    eng.slots[0].next = x
    out = eng.verify(0, [d])
    firsts.append(out[0]); accepted += out[0] == d
    assert len(out) == 1 + (out[0] == d)
  freq = np.bincount(firsts, minlength=VOCAB) / n
  top = np.argsort(-p)[:4]
  tol = 4 * np.sqrt(p[top] * (1 - p[top]) / n) + 3e-3
  assert (np.abs(freq[top] - p[top]) <= tol).all(), (freq[top], p[top])
  assert abs(accepted / n - p[d]) <= 4 * np.sqrt(p[d] * (1 - p[d]) / n) + 3e-3, (accepted / n, p[d])

@pytest.mark.parametrize("a", [0.05, 0.3, 0.5, 0.7, 0.9, 0.97])
def test_speculator_weighs_the_verify_cost(rng, a):
  """A source whose proposals are each right with probability a (given the ones before held), verify steps that
  cost 3.1 and 4.5 decode steps (SmolLM2 with heuristic kernels, H100, docs/PERF.md): speculating costs at most 5%
  more device time per token than plain decoding where proposals do not pay, and gets most of the gain where they
  clearly do."""
  sp = Speculator(NgramDraft(), cost={4: 3.1, 8: 4.5})
  tokens = spent = 0.0
  while tokens < 20000:
    if (k := sp.want()) > 0:
      acc = 0
      while acc < k and rng.random() < a: acc += 1
      sp.update(k, acc)
      tokens, spent = tokens + acc + 1, spent + sp.cost[next(K for K in sorted(sp.cost) if K >= k + 1)]
    else:
      n = sp.stretch(8)
      sp.rested(n)
      tokens, spent = tokens + n, spent + n
  speed = tokens / spent  # against plain decoding's one token per step
  best = max((1 - a ** (k + 1)) / (1 - a) / c for k, c in ((3, 3.1), (7, 4.5)))
  # never much slower; near the break-even point the gain is left to chance; clearly paying proposals pay
  if best < 1.4: assert speed >= 0.95, (a, speed, sp.stats())
  else: assert speed >= 0.85 * best, (a, speed, best, sp.stats())

def test_speculator_stretches():
  sp = Speculator(NgramDraft(), cost={})
  assert sp.stretch(8) == 2 and sp.stretch(1) == 1
  sp.resting = 5
  assert sp.stretch(8) == 8
