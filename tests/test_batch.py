"""Several sequences at once (engine slots, batched decode steps): each sequence of a batch computes what it
computes alone, whatever the others do; idle slots keep what they cache."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm import quant
from orin_llm.engine import Engine
from orin_llm.errors import OrinError
from orin_llm.quant import QuantWeight
from orin_llm.model import KV_BLOCK, ROW_BLOCK, key_block
from orin_llm.sampling import Sampling
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB, QWEN_VOCAB, seed_for

VOCAB = 2048

def rel_err(a, b): return float(np.linalg.norm(a - b) / np.linalg.norm(b))

@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen3"])
def eng(request, tmp_path_factory):
  seed = seed_for(f"test_batch {request.param}")  # ORIN_TEST_SEED replays the model too
  vocab = QWEN_VOCAB if request.param.endswith("qwen3") else LLAMA_VOCAB
  path = write_model(tmp_path_factory.mktemp("b") / "m.gguf", preset(request.param), QT.Q4_K, vocab, seed=seed, vocab_size=VOCAB)
  return Engine(path, max_context=300, chunk=8, max_batch=4)

def test_batch_logits_equal_alone(eng, rng):
  """Three sequences of different lengths decoded together in a batch of 4 (slot 3 idle): the logits of every row
  at every step equal those of the same sequence decoded alone, step by step."""
  prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in rng.choice(np.arange(3, 40), 3, replace=False)]
  feed = [rng.integers(0, VOCAB, 4).tolist() for _ in prompts]  # the tokens each step gets, fixed in advance
  alone = []
  for p, f in zip(prompts, feed):
    eng.reset()
    eng.prefill(0, p)
    rows = []
    for i, t in enumerate(f):
      eng.slots[0].next = t; eng._copy_in(eng.state.next_tok, 0, np.array([t], np.int32))
      eng.decode([0], 1)
      rows.append(eng.state.logits[0].numpy())
    alone.append(rows)
  eng.reset()
  for s, p in enumerate(prompts): eng.prefill(s, p)
  eng.prefill(3, prompts[0][:2])  # an idle slot with a cached sequence: it must keep it
  kept = list(eng.slots[3].cached)
  for i in range(4):
    for s in range(3):
      eng.slots[s].next = feed[s][i]; eng._copy_in(eng.state.next_tok, s, np.array([feed[s][i]], np.int32))
    eng.decode([0, 1, 2], 1)
    got = eng.state.logits[0:3].numpy()
    for s in range(3): assert rel_err(got[s], alone[s][i]) < 1e-4, (s, i)
  assert eng.slots[3].cached == kept
  eng.slots[3].next = 5; eng._copy_in(eng.state.next_tok, 3, np.array([5], np.int32))
  eng.decode([3], 1)  # slot 3 decodes on from its two cached tokens: as if nobody had used the others
  want = eng.state.logits[0].numpy()
  eng.reset(3); eng.prefill(3, prompts[0][:2] + [5])
  assert rel_err(eng.state.logits[0].numpy(), want) < 1e-3

def test_short_steps_equal_long_ones(eng, rng, monkeypatch):
  """Decode and batch steps in the attention's short blocks (model.SHORT_BLOCK keys, run while every row attends to at
  most engine.short_keys keys) give the logits of the steps in ROW_BLOCK-key blocks, step by step across the bound,
  alone and in a batch; the engine ran both kinds."""
  prompts = [rng.integers(0, VOCAB, n).tolist() for n in (40, int(rng.integers(20, 40)))]
  feed = rng.integers(0, VOCAB, (12, 2)).tolist()
  def run(bound: int) -> list:
    monkeypatch.setattr(eng, "short_keys", bound)
    eng.reset()
    for s, p in enumerate(prompts): eng.prefill(s, p)
    out = []
    for i, toks in enumerate(feed):
      slots = [0] if i < 4 else [0, 1]  # slot 0 alone at positions 40..43, then both (slot 0 at 44..51)
      for s in slots: eng.slots[s].next = toks[s]; eng._copy_in(eng.state.next_tok, s, np.array([toks[s]], np.int32))
      eng.decode(slots, 1)
      out.append(eng.state.logits[0:len(slots)].numpy())
    return out
  long, short = run(0), run(48)
  for i, (a, b) in enumerate(zip(short, long)): assert rel_err(a, b) < 1e-4, i
  assert {"chunk1", "chunk1-short", "batch2", "batch2-short"} <= set(eng.steps.jits)

@pytest.mark.parametrize("sampled", [False, True])
def test_batch_tokens_equal_alone(eng, rng, sampled):
  """Greedy and sampled generation (noise from each row's seed and position) give the same tokens in a batch as
  alone: lookahead of several steps, sequences that join late."""
  prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in (9, 17)]
  samp = [Sampling(2.0, 0, 1.0, int(rng.integers(1 << 20))) if sampled else Sampling() for _ in prompts]
  alone = []
  for p, s in zip(prompts, samp):
    eng.reset()
    alone.append(list(eng.generate(p, 9, s, lookahead=4)))
  eng.reset()
  out = [[eng.prefill(0, prompts[0], samp[0])], []]
  out[0] += eng.decode([0], 2)[:, 0].tolist()  # slot 0 starts alone
  out[1].append(eng.prefill(1, prompts[1], samp[1]))  # slot 1 joins
  o = eng.decode([0, 1], 4)
  out[0] += o[:, 0].tolist(); out[1] += o[:, 1].tolist()
  o = eng.decode([0, 1], 2)
  out[0] += o[:, 0].tolist(); out[1] += o[:, 1].tolist()
  out[1] += eng.decode([1], 2)[:, 0].tolist()  # slot 0 left
  assert out[0] == alone[0][:9] and out[1] == alone[1][:9], (out, alone)

@pytest.mark.parametrize("sampled", [False, True])
def test_ahead_rounds_equal_plain(eng, rng, sampled):
  """decode(ahead=True) queues the next round's model step before it reads the round's tokens, and the next round of
  the same slots starts from that step. Rounds of varying length, a slot joining (its prefill runs between two rounds
  and writes the logits the queued step left), the batch growing and shrinking, a slot whose next token the caller
  changed: the tokens equal those of rounds without it, and the queued step is used exactly where nothing intervened."""
  prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in (11, 5, 23)]
  samp = [Sampling(2.0, 0, 1.0, int(rng.integers(1 << 20))) if sampled else Sampling() for _ in prompts]
  def run(ahead: bool) -> list[list[int]]:
    eng.reset()
    used, out = eng.ahead_used, [[] for _ in prompts]
    def rounds(slots, ns):
      for n in ns:
        o = eng.decode(slots, n, ahead=ahead)
        for j, s in enumerate(slots): out[s] += o[:, j].tolist()
    out[0].append(eng.prefill(0, prompts[0], samp[0]))
    rounds([0], (3, 1, 2))            # alone: rounds 2 and 3 start from the step queued ahead
    out[1].append(eng.prefill(1, prompts[1], samp[1]))
    rounds([0], (2,))                 # the prefill ran between (and wrote the logits): the queued step is not used
    rounds([0, 1], (2, 1, 3))         # a join: a different batch first, then the same
    out[2].append(eng.prefill(2, prompts[2], samp[2]))
    rounds([0, 1, 2], (2,))
    rounds([1, 2], (2, 1))            # slot 0 left: a different batch, then the same again
    rounds([2], (1,))
    eng.slots[2].next = out[2][-1] = R
    rounds([2], (2,))                 # the caller replaced slot 2's next token: the queued step read the old one
    return out, eng.ahead_used - used
  R = int(rng.integers(VOCAB))
  plain, n_plain = run(False)
  got, n_ahead = run(True)
  assert got == plain, (got, plain)
  assert n_plain == 0 and n_ahead == 2 + 2 + 1, n_ahead

def engine_with_matmul_rows(tmp_path_factory, rows: int):
  """An engine of 4 slots (prompt steps of 4 rows a sequence, chunks of 8) on a fresh tiny model, with
  quant.MATMUL_ROWS = rows while the module's tests run (a GPU's is 32)."""
  seed = seed_for(f"test_batch tiny-llama, matrix rows {rows}")
  path = write_model(tmp_path_factory.mktemp("m") / "m.gguf", preset("tiny-llama"), QT.Q4_K, LLAMA_VOCAB, seed=seed, vocab_size=VOCAB)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(quant, "MATMUL_ROWS", rows)
    yield Engine(path, max_context=300, chunk=8, max_batch=4)

@pytest.fixture(scope="module")
def eng_matrix(tmp_path_factory):
  """An engine whose prompt steps of 4 rows a sequence take the matrix form, as a GPU's of 32 do (quant.MATMUL_ROWS)."""
  yield from engine_with_matmul_rows(tmp_path_factory, 4)

@pytest.mark.parametrize("sampled", [False, True])
def test_prompts_prefilled_together_equal_alone(eng, rng, sampled):
  """Three prompts prefilled in steps over every slot (prefill_together, group_rows tokens each a step; one prompt
  longer than a step, one sharing a cached prefix with its slot) give the first-token logits and tokens each gives
  prefilled alone, and then decode as it does; slot 3, idle, keeps what it caches. Here the rows' attention form
  (attend_rows), as on a CPU."""
  assert key_block(eng.group_rows, eng.max_batch) == ROW_BLOCK
  check_prefilled_together(eng, rng, sampled)

def test_prompts_prefilled_together_in_the_matrix_form_equal_alone(eng_matrix, rng):
  """As above, with the prompts' rows in the matrix form (attend_chunk over several sequences, float16 products),
  as a GPU runs them."""
  assert key_block(eng_matrix.group_rows, eng_matrix.max_batch) == KV_BLOCK
  check_prefilled_together(eng_matrix, rng, sampled=False)

@pytest.fixture(scope="module")
def eng_matrix_together(tmp_path_factory):
  """An engine whose prompt steps of 4 rows a sequence are under quant.MATMUL_ROWS (8) alone, and take the matrix form
  together (16 rows): a GPU's group of 16 rows a sequence (ORIN_LLM_GROUP_ROWS=16) against MATMUL_ROWS 32."""
  yield from engine_with_matmul_rows(tmp_path_factory, 8)

def test_prompts_under_the_matrix_rows_prefilled_together_in_the_matrix_form(eng_matrix_together, rng):
  """As above, where each sequence's rows (4) are fewer than quant.MATMUL_ROWS (8) and the 4 sequences' together
  (16) are not: the step takes the matrix form (model.attends_as_matrix), as a GPU's group of 16 rows a sequence."""
  eng = eng_matrix_together
  assert eng.group_rows < quant.MATMUL_ROWS <= eng.group_rows * eng.max_batch and key_block(eng.group_rows, eng.max_batch) == KV_BLOCK
  check_prefilled_together(eng, rng, sampled=False)

def test_prompts_of_the_first_slots_prefilled_in_a_smaller_step(eng, rng):
  """Two prompts in slots 0 and 1 of 4 run in the group step of the smallest batch size that holds them (2 slots:
  half the rows), give what they give alone, and leave slots 2 and 3 (idle, each caching a sequence) as they were."""
  before = set(eng.steps.jits)
  check_prefilled_together(eng, rng, sampled=False, n=2)
  assert f"group2x{eng.group_rows}" in eng.steps.jits and f"group4x{eng.group_rows}" not in set(eng.steps.jits) - before

def check_prefilled_together(eng, rng, sampled: bool, n: int = 3):
  """n prompts (2 or 3) in slots 0..n-1, prefilled together, against each alone; the slots from n on idle, caching."""
  G = eng.group_rows
  lens = [G + 3 + int(rng.integers(0, G)), int(rng.integers(1, G + 1)), 2 * G + 1][:n]
  prompts = [rng.integers(0, VOCAB, k).tolist() for k in lens]
  samp = [Sampling(2.0, 0, 1.0, int(rng.integers(1 << 20))) if sampled else Sampling() for _ in prompts]
  prefix = prompts[2][:G + 2] if n == 3 else []  # slot 2 holds a prefix of its prompt from before: only the rest runs
  alone = []
  for p, s in zip(prompts, samp):
    eng.reset()
    tok = eng.prefill(0, p, s)
    logits = eng.state.logits[0].numpy()
    alone.append((tok, logits, eng.decode([0], 3)[:, 0].tolist()))
  eng.reset()
  if n == 3: eng.prefill(2, prefix)
  for b in range(n, eng.max_batch): eng.prefill(b, prompts[0][b - n:b - n + 5])
  kept = {b: list(eng.slots[b].cached) for b in range(n, eng.max_batch)}
  jobs, first, logits, steps = {b: (p, s) for b, (p, s) in enumerate(zip(prompts, samp))}, {}, {}, 0
  while jobs:
    got = eng.prefill_together(jobs)
    steps += 1
    for b in [b for b in jobs if got[b] == len(jobs[b][0])]:
      first[b], logits[b] = eng.first_token(b), eng.state.logits[b].numpy()
      del jobs[b]
  assert steps == max(-(-lens[0] // G), -(-lens[1] // G), *([-(-(lens[2] - len(prefix)) // G)] if n == 3 else []))
  assert all(eng.slots[b].cached == prompts[b] for b in range(n)) and {b: eng.slots[b].cached for b in kept} == kept
  out = eng.decode(list(range(n)), 3)
  for b, (tok, want, rest) in enumerate(alone):
    # Not 1e-4: a prompt's keys and values, computed in other steps (other rows beside them, another summation order),
    # differ by ~1e-7 in float32, and where one lies near a float16 rounding boundary its cached value differs by an
    # ulp or two (4.9e-4 relative). Over 24 draws of models and prompts the logits differed by ~2.5e-7 in most,
    # 1.5e-6 to 4.4e-5 in five (5 cached values of 2560 one or two ulps apart in the worst), 7.4e-4 in one CI run.
    # A wrong slot, position or prefix moves them by ~1.
    assert rel_err(logits[b], want) < 5e-3, b
    assert first[b] == tok and out[:, b].tolist() == rest, b

def test_a_first_token_fetched_before_the_next_prompts_step(eng, rng):
  """The server's order (worker.Scheduler.tick): slot 0's prompt, the copy of its first token queued (fetch_first),
  then the step of slots 1 and 2's prompts together, whose idle rows (0 among them) choose and write next_tok too, and
  only then read_first: each slot's first token and the tokens it decodes next are those it gets alone."""
  prompts = [rng.integers(0, VOCAB, int(k)).tolist() for k in rng.integers(2, eng.group_rows + 1, 3)]
  alone = []
  for p in prompts:
    eng.reset()
    alone.append([eng.prefill(0, p)] + eng.decode([0], 3)[:, 0].tolist())
  eng.reset()
  for _ in eng.prefill_chunks(0, prompts[0]): pass
  eng.fetch_first([0])
  assert eng.prefill_together({1: (prompts[1], Sampling()), 2: (prompts[2], Sampling())}) == {1: len(prompts[1]), 2: len(prompts[2])}
  # a step queued after the fetch may write slot 0's next_tok (that step's idle row 0 chose too, at slot 0's length,
  # which may or may not give the same token): here certainly, so that a copy made at read_first would read it
  eng._copy_in(eng.state.next_tok, 0, np.array([(alone[0][0] + 1) % VOCAB], np.int32))
  assert eng.read_first() == {0: alone[0][0]}
  eng.fetch_first([1, 2])
  assert eng.read_first() == {1: alone[1][0], 2: alone[2][0]}
  out = eng.decode([0, 1, 2], 3)
  for b in range(3): assert out[:, b].tolist() == alone[b][1:], b
  eng.fetch_first([0])
  eng.reset()  # what the server does after a failure, which may come between a fetch and its read
  eng.fetch_first([0])  # a fetch left unread would make this one fail (one fetch at a time)
  eng.read_first()

def test_interleaved_prompts_each_run_their_own_tokens(eng, rng):
  """Two prompts of several chunks each, prefilled a chunk at a time in turn (as the server's scheduler runs joining
  jobs): each gets the first-token logits it gets alone. The prompt buffer is shared by the slots."""
  prompts = [rng.integers(0, VOCAB, 3 * eng.chunk + int(rng.integers(1, eng.chunk))).tolist() for _ in range(2)]
  alone = []
  for p in prompts:
    eng.reset(); eng.prefill(0, p); alone.append(eng.state.logits[0].numpy())
  eng.reset()
  its, got = [eng.prefill_chunks(b, p) for b, p in enumerate(prompts)], {}
  while its:
    for b, it in list(enumerate(its)):
      if it is None: continue
      if next(it, None) == len(prompts[b]): got[b], its[b] = eng.state.logits[0].numpy(), None
    if all(it is None for it in its): break
  for b in range(2): assert rel_err(got[b], alone[b]) < 1e-4, b

def test_prefill_from_float16_copies_equals_dequantizing_in_the_step(tmp_path, rng, monkeypatch):
  """prefill_copy_mb: the layers' matrices kept in float16 beside their planes (where all fit in the bound) and
  multiplied as they are by the matrix-form chunks give the logits the chunks give dequantizing each matrix in the
  step (the same float16 values), with fewer kernels a chunk; decode still reads the planes. A bound under what the
  copies take keeps none; a negative one is refused."""
  seed = int(rng.integers(1 << 31))
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q4_K, LLAMA_VOCAB, seed=seed, vocab_size=VOCAB)
  monkeypatch.setattr(quant, "MATMUL_ROWS", 4)
  prompt = rng.integers(0, VOCAB, 21).tolist()
  out = {}
  for mb in (0, quant.DEFAULT_PREFILL_COPY_MB):
    eng = Engine(path, max_context=64, chunk=8, prefill_copy_mb=mb)
    want = quant.dense_bytes(eng.weights)
    assert 0 < want <= 2 ** 20 * quant.DEFAULT_PREFILL_COPY_MB and eng.dense_bytes == (want if mb else 0)
    assert all((w.dense is not None) == bool(mb) for n, w in eng.weights.items() if n.startswith("blk.") and isinstance(w, QuantWeight))
    first = eng.prefill(0, prompt)
    out[mb > 0] = (first, eng.state.logits[0].numpy(), eng.decode([0], 4)[:, 0].tolist(), len(eng.steps.chunk(8).captured.linear.src))
  (f0, l0, d0, k0), (f1, l1, d1, k1) = out[False], out[True]
  np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-5 * np.abs(l0).max())
  assert np.linalg.norm(l0) > 0 and f1 == f0 and d1 == d0
  assert k1 < k0, (k1, k0)  # no dequantization kernels in the chunk
  # the bound: copies that take more than it are not kept (the tiny model's take under 1 MiB: the bound scaled down)
  monkeypatch.setattr(quant, "dense_bytes", lambda w: 3 * 2 ** 20)
  assert Engine(path, max_context=64, chunk=8, prefill_copy_mb=2).dense_bytes == 0
  with pytest.raises(OrinError, match="prefill_copy_mb"): Engine(path, max_context=64, chunk=8, prefill_copy_mb=-1)
  # at the bound, kept; a draft model's engine gets what the copies leave of it
  eng = Engine(path, max_context=64, chunk=8, prefill_copy_mb=3)
  assert eng.dense_bytes == 3 * 2 ** 20 and eng.prefill_copy_left() == 0
  assert Engine(path, max_context=64, chunk=8, prefill_copy_mb=5).prefill_copy_left() == 2

def test_prefill_copies_that_do_not_fit_on_the_device_are_dropped(tmp_path, rng, monkeypatch):
  """A device that runs out of memory while the float16 copies are made (the Orin's memory is shared): the engine
  starts without any copy and prefills by dequantizing, with the logits of an engine built without copies."""
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q4_K, LLAMA_VOCAB, seed=int(rng.integers(1 << 31)), vocab_size=VOCAB)
  monkeypatch.setattr(quant, "MATMUL_ROWS", 4)
  made, keep = [], QuantWeight.keep_dense
  def short(w):
    if len(made) == 3: raise RuntimeError("CUDA Error 2, out of memory")
    keep(w); made.append(w)
  monkeypatch.setattr(QuantWeight, "keep_dense", short)
  eng = Engine(path, max_context=64, chunk=8)
  assert len(made) == 3 and eng.dense_bytes == 0 and eng.prefill_copy_left() == quant.DEFAULT_PREFILL_COPY_MB
  assert all(w.dense is None for w in eng.weights.values() if isinstance(w, QuantWeight))
  prompt = rng.integers(0, VOCAB, 13).tolist()
  eng.prefill(0, prompt)
  monkeypatch.setattr(QuantWeight, "keep_dense", keep)
  plain = Engine(path, max_context=64, chunk=8, prefill_copy_mb=0)
  plain.prefill(0, prompt)
  np.testing.assert_array_equal(eng.state.logits[0].numpy(), plain.state.logits[0].numpy())

def test_a_float16_matrix_is_its_own_prefill_copy(tmp_path, rng, monkeypatch):
  """F16 files: a layer's matrix is already float16, so its plane is the copy (no second one, no bytes counted)."""
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.F16, LLAMA_VOCAB, seed=int(rng.integers(1 << 31)), vocab_size=VOCAB)
  monkeypatch.setattr(quant, "MATMUL_ROWS", 4)
  eng = Engine(path, max_context=64, chunk=8)
  mats = [w for n, w in eng.weights.items() if n.startswith("blk.") and isinstance(w, QuantWeight)]
  assert mats and all(w.qtype == QT.F16 and w.dense is w.planes["w"] for w in mats) and eng.dense_bytes == 0

def test_prefill_copy_mb_config_key(tmp_path):
  """The server's prefill_copy_mb: read from the TOML file, 0 accepted, a negative number or another type refused
  with the key's name."""
  from orin_llm.server.config import from_toml, ServerConfig
  assert ServerConfig().prefill_copy_mb == quant.DEFAULT_PREFILL_COPY_MB
  for text, want in (("prefill_copy_mb = 0", 0), ("prefill_copy_mb = 20000", 20000)):
    (tmp_path / "c.toml").write_text(text + "\n"); assert from_toml(tmp_path / "c.toml").prefill_copy_mb == want
  for bad in ("-1", '"8192"', "true", "1.5"):
    (tmp_path / "c.toml").write_text(f"prefill_copy_mb = {bad}\n")
    with pytest.raises(OrinError, match="prefill_copy_mb"): from_toml(tmp_path / "c.toml")

def test_group_rows_knob():
  """ORIN_LLM_GROUP_ROWS (an experiment): the group step's rows per sequence with tensor cores; the CPU's stay
  under quant.MATMUL_ROWS; a bad value is refused with the variable's name."""
  from orin_llm.engine import group_rows, SMALL_CHUNK, NO_TC_CHUNK
  from orin_llm.errors import OrinError
  assert group_rows(True, 4, {}) == SMALL_CHUNK and group_rows(True, 4, {"ORIN_LLM_GROUP_ROWS": "16"}) == 16
  # (quant.MATMUL_ROWS is not read here: this module's engine fixtures patch it for the module's remaining tests)
  assert group_rows(False, 4, {"ORIN_LLM_GROUP_ROWS": "16"}) == group_rows(False, 4, {}) == NO_TC_CHUNK // 4
  for bad in ("1", "x", "4096"):
    with pytest.raises(OrinError, match="ORIN_LLM_GROUP_ROWS"): group_rows(True, 4, {"ORIN_LLM_GROUP_ROWS": bad})

def test_batch_rows_in_the_affine_form(tmp_path, rng, monkeypatch):
  """ORIN_LLM_AFFINE_ROWS=4 (quant.AFFINE_ROWS): a batch step's Q4_K products run in the affine form (each group's
  scale and minimum taken out of its sum; test_0040 pins the layout); its logits equal those of one sum."""
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q4_K, LLAMA_VOCAB, seed=int(rng.integers(1 << 31)), vocab_size=VOCAB)
  prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in rng.choice(np.arange(3, 30), 3, replace=False)]
  logits = {}
  monkeypatch.setattr(quant, "AFFINE", (QT.Q4_K,))  # whatever ORIN_LLM_AFFINE the environment sets
  for rows in (1, 4):
    monkeypatch.setattr(quant, "AFFINE_ROWS", rows)
    e = Engine(path, max_context=64, chunk=8, max_batch=4)
    w = e.model.blocks[0].down
    assert w.affine(e.state.logits[0:3, :w.cols]) == (rows == 4)
    for s, p in enumerate(prompts): e.prefill(s, p)
    e.decode([0, 1, 2], 1)
    logits[rows] = e.state.logits[0:3].numpy()
  assert rel_err(logits[4], logits[1]) < 1e-4

def test_affine_rows_knob():
  from orin_llm.quant import AFFINE_MAX_ROWS, affine_rows
  assert affine_rows({}) == 1 and affine_rows({"ORIN_LLM_AFFINE_ROWS": "4"}) == 4
  for bad in ("0", str(AFFINE_MAX_ROWS + 1), "four", "-1"):
    with pytest.raises(OrinError, match="ORIN_LLM_AFFINE_ROWS"): affine_rows({"ORIN_LLM_AFFINE_ROWS": bad})

def test_one_store_for_the_rows_of_several_sequences(tmp_path, rng, monkeypatch):
  """model.ONE_STORE (the default; ORIN_LLM_ONE_STORE=0 turns it off): a step over several sequences writes their new keys and values with one
  store (its target their slices side by side; tinygrad patch 0048), not one per sequence: the batch step of 4 runs 3
  kernels fewer a layer, its logits equal the per-sequence stores' exactly, and prompts prefilled together (several
  rows a sequence) give what each gives alone."""
  from tinygrad.uop.ops import Ops
  from orin_llm import model
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama"), QT.Q4_K, LLAMA_VOCAB, seed=int(rng.integers(1 << 31)), vocab_size=VOCAB)
  prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in rng.choice(np.arange(3, 30), 4, replace=False)]
  logits, kernels = {}, {}
  for one in (0, 1):
    monkeypatch.setattr(model, "ONE_STORE", one)
    e = Engine(path, max_context=64, chunk=8, max_batch=4)
    for s, p in enumerate(prompts): e.prefill(s, p)
    for _ in range(3): e.decode([0, 1, 2, 3], 1)  # the third call replays the captured step
    logits[one] = e.state.logits[0:4].numpy()
    calls = e.steps.jits["batch4-short"].captured.linear.src  # (the short step: positions under model.SHORT_KEYS) a graph's calls in its place (scripts/graph_ablation.py)
    kernels[one] = sum(len(c.src[0].src[0].src) if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph" else 1 for c in calls)
    if one: check_prefilled_together(e, rng, sampled=False)
  assert np.array_equal(logits[1], logits[0])
  assert kernels[0] - kernels[1] == 3 * len(e.model.blocks), kernels
