"""Structured output without a model: llguidance's view of our vocabularies, constraints on random schemas driven
by random choices among the tokens each mask allows (as a random-weights model makes them), schema errors with the
part named, tool-call grammars of each family, their parsing and their streaming; the mask on the device."""
import functools, json
import numpy as np
import pytest
from vocab_files import metadata, tokenizer
import schemas

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
from orin_llm import structured as S
from orin_llm.tokenizer import Tokenizer

def with_tool_tokens(name: str) -> dict:
  """The vocabulary's metadata with the tool-call tokens of the models that use it: the vocabularies in ../shared
  are LLaMA 3.0's and Qwen2's, whose reserved slots LLaMA 3.1 and Qwen2.5/Qwen3 fill with these (same ids)."""
  md = dict(metadata(name))
  toks, types = list(md["tokenizer.ggml.tokens"]), list(md["tokenizer.ggml.token_type"])
  if name == "llama-bpe": new = {128008: ("<|eom_id|>", 3), 128010: ("<|python_tag|>", 3)}
  else: new = {151657: ("<tool_call>", 4), 151658: ("</tool_call>", 4), 151665: ("<tool_response>", 4), 151666: ("</tool_response>", 4),
               151667: ("<think>", 4), 151668: ("</think>", 4)}
  for i, (t, ty) in new.items(): toks[i], types[i] = t, ty
  md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"] = toks, types
  return md

@functools.cache
def grammars(name: str) -> S.Grammars:
  tok = Tokenizer.from_metadata(with_tool_tokens(name))
  return S.Grammars(tok, tok.vocab_size)

def run(g: S.Grammars, c: S.Constraint, rng, max_tokens=400) -> list[int]:
  """Tokens chosen at random among those each mask allows, until the grammar is complete or an end token."""
  out = []
  for _ in range(max_tokens):
    w = c.mask_words()
    allowed = np.flatnonzero(np.unpackbits(w.view(np.uint8), bitorder="little")[:g.n_vocab])
    t = int(rng.choice(allowed))
    out.append(t)
    if c.advance(t) or t in g.tok.stop_ids: return out
  raise AssertionError(f"not complete after {max_tokens} tokens: {g.tok.decode(out)!r}")

def test_vocabulary_bridge():
  g = grammars("qwen2")
  v = S._Vocab(g.tok, g.n_vocab + 3)
  assert len(v.tokens) == g.n_vocab + 3 and v.tokens[-1] == b""
  tc = g.tok.tokens.index("<tool_call>")
  assert v.tokens[tc] == b"\xff<tool_call>" and v.tokens[g.tok.tokens.index("<|im_end|>")] == b"\xff<|im_end|>"
  assert g.has_token("<tool_call>") and not g.has_token("hello")
  for i in (0, 100, 5000, 151000): assert v.tokens[i] == g.tok.piece(i)  # the bytes our decoder gives
  assert v("a <tool_call> b") == g.tok.encode("a <tool_call> b", bos=False, special=False)
  assert set(g.lltok().eos_tokens) == set(g.tok.stop_ids)

@pytest.mark.parametrize("vocab", ["llama-bpe", "qwen2"])
def test_random_schemas_random_choices(vocab, rng):
  """50 random schemas, each value built from random allowed tokens: every one parses and validates."""
  g = grammars(vocab)
  lengths = []
  for _ in range(50):
    schema = schemas.schema(rng)
    c = g.constraint(S.json_grammar(schema, strict=True))
    out = run(g, c, rng)
    assert c.done and out[-1] not in g.tok.stop_ids  # ends when the object closes, without an end token
    text = g.tok.decode(out)
    jsonschema.validate(json.loads(text), schema)
    lengths.append(len(out))
  print(f"tokens per value: median {np.median(lengths)}, max {max(lengths)}")

def test_json_object_and_strict():
  g = grammars("llama-bpe")
  def feed(grammar, text):  # the tokens of text, each checked against its mask; whether the grammar is then complete
    c = g.constraint(grammar)
    for t in g.tok.encode(text, bos=False):
      c.mask_words()
      if not c.allowed(t): return None
      c.advance(t)
    return c.done
  any_object = S.json_grammar({"type": "object"}, False)
  assert feed(any_object, '{"a": [1, {"b": null}], "c": "d"}') is True
  assert feed(any_object, '{\n  "a": 1\n}') is True  # line breaks and an indent
  assert feed(any_object, '[1]') is None and feed(any_object, '{"a":' + ' ' * 30 + '1}') is None  # not an object; unbounded padding
  # strict closes objects that say nothing of other keys; without strict they stay open (JSON Schema's default)
  s = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
  assert S.close_objects(s)["additionalProperties"] is False and "additionalProperties" not in s
  assert S.close_objects({"allOf": [s]}) == {"allOf": [s]}  # members of allOf close nothing on their own
  nested = S.close_objects({"type": "array", "items": s})
  assert nested["items"]["additionalProperties"] is False

@pytest.mark.parametrize("schema,words,at", [
  ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not", "#/properties/a/not"),
  ({"type": "object", "properties": {"when": {"type": "string", "format": "moon-phase"}}}, "moon-phase", "#/properties/when/format"),
  ({"type": "array", "items": {"type": "string", "pattern": "(?=a)b"}}, "look-around", "#/items/pattern"),
  ({"type": "object", "properties": {"n": {"type": "integr"}}}, "integr", "#/properties/n/type"),
  ({"type": "object", "properties": {"p": {"$ref": "#/$defs/missing"}}}, "missing", "#/properties/p/$ref"),
  ({"type": "array", "uniqueItems": True}, "uniqueItems", "#/uniqueItems"),
])
def test_unsupported_schema_names_the_part(schema, words, at):
  g = grammars("llama-bpe")
  with pytest.raises(S.GrammarError) as e: g.constraint(S.json_grammar(schema), "response_format.json_schema.schema", schema)
  msg = str(e.value)
  assert msg.startswith("response_format.json_schema.schema cannot be enforced: ") and words in msg and at in msg and "\n" not in msg, msg

@pytest.mark.parametrize("schema", [{"type": "string", "minLength": 5, "maxLength": 2}, {"allOf": [{"type": "string"}, {"type": "integer"}]},
                                    {"type": "integer", "minimum": 5, "maximum": 2}])
def test_unsatisfiable_schema_fails_cleanly(schema):
  """A schema no value satisfies: refused up front, or the request fails at its first token (no endless masking)."""
  g = grammars("llama-bpe")
  with pytest.raises(S.OrinError):
    c = g.constraint(S.json_grammar(schema))
    for _ in range(20):
      w = c.mask_words()
      c.advance(int(np.flatnonzero(np.unpackbits(w.view(np.uint8), bitorder="little"))[0]))

# ------------------------------------------------------------------ tool calls
TOOLS = [
  {"type": "function", "function": {"name": "set_light", "description": "Switch a light", "parameters": {
    "type": "object", "properties": {"room": {"enum": ["kitchen", "hall"]}, "on": {"type": "boolean"}, "level": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["room", "on"]}}},
  {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "ping"}},  # no parameters: {} arguments
]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False}) for t in TOOLS}

def check_calls(calls, names=None):
  assert calls
  for c in calls:
    assert c["name"] in (names or SCHEMAS)
    jsonschema.validate(json.loads(c["arguments"]), S.close_objects(SCHEMAS[c["name"]]))

def stream_all(fmt, text: str, rng) -> tuple[list[dict], str, list[dict]]:
  """(calls, content, deltas) of text pushed through a ToolStream in random pieces, calls put together as a client does."""
  st, deltas, i = S.ToolStream(fmt), [], 0
  while i < len(text):
    n = int(rng.integers(1, 6)); deltas += st.push(text[i:i + n]); i += n
  deltas += st.finish()
  calls, content = {}, ""
  for d in deltas:
    assert set(d) <= {"content", "tool_calls"}
    content += d.get("content", "")
    for tc in d.get("tool_calls", []):
      if "id" in tc:
        assert tc["index"] == len(calls) and tc["type"] == "function" and tc["id"].startswith("call_")
        calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}  # arguments come in this delta or later ones
      else: assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
      calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
  return [calls[k] for k in sorted(calls)], content, deltas

@pytest.mark.parametrize("vocab,fmt", [("llama-bpe", S.Llama3), ("qwen2", S.Hermes), ("llama-bpe", S.Generic)])
@pytest.mark.parametrize("parallel", [True, False])
def test_tool_grammar_parse_stream(vocab, fmt, parallel, rng):
  g = grammars(vocab)
  f = fmt(g)
  for k in range(8):
    tools = TOOLS if k % 2 else [TOOLS[k % 3]]  # all, or one named function
    c = g.constraint(f.grammar(tools, parallel))
    out = run(g, c, rng, 4000)  # random choices may chain many calls where a call may follow
    text = g.tok.decode(out)
    content, calls = f.parse(text)
    assert content == "", text
    check_calls(calls, [t["function"]["name"] for t in tools])
    if not parallel or fmt is S.Llama3: assert len(calls) == 1
    scalls, scontent, _ = stream_all(f, text, rng)
    assert scalls == calls and scontent == ""

def test_tool_parse_text_and_mixed(rng):
  h, l = S.Hermes(), S.Llama3()
  assert h.parse("Just text.") is None and l.parse("Just text.") is None and l.parse("{not json") is None
  text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n{"arguments": {}, "name": "ping"}\n</tool_call>'
  content, calls = h.parse(text)
  assert content == "Let me check." and calls == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}, {"name": "ping", "arguments": "{}"}]
  scalls, scontent, _ = stream_all(h, text, rng)
  assert scalls == calls and scontent == "Let me check."
  assert h.parse('<tool_call>\n{"name": "ping", "arguments": {"a": }\n</tool_call>') is None  # broken JSON: not a call
  scalls, scontent, _ = stream_all(h, "Plain answer, no calls at all.", rng)
  assert scalls == [] and scontent == "Plain answer, no calls at all."
  scalls, scontent, _ = stream_all(h, "a < b <tool", rng)  # a held-back prefix of <tool_call> comes out at the end
  assert scontent == "a < b <tool"
  # LLaMA 3: the whole answer is the call; "parameters" or "arguments"; calls separated by ';' (vLLM's parser takes them)
  one = '{"name": "set_light", "parameters": {"room": "hall", "on": true}}'
  assert l.parse(" " + one) == ("", [{"name": "set_light", "arguments": '{"room": "hall", "on": true}'}])
  assert len(l.parse(one + "; " + one)[1]) == 2
  assert l.parse('{"type": "function", "name": "ping", "parameters": {}}') == ("", [{"name": "ping", "arguments": "{}"}])
  assert stream_all(l, one, rng)[0] == l.parse(one)[1]
  assert stream_all(l, '{"answer": 42}', rng)[:2] == ([], '{"answer": 42}')  # JSON that is no call is text

def test_tool_format_by_template():
  from pathlib import Path
  d = Path(__file__).parent / "data" / "templates"
  assert isinstance(S.tool_format((d / "llama3.1.jinja").read_text()), S.Llama3)
  assert type(S.tool_format((d / "qwen3.jinja").read_text())) is S.Hermes
  assert type(S.tool_format(None)) is S.Generic  # ChatML fallback: tools go into the system message
  msgs = S.Generic().messages([{"role": "user", "content": "hi"}], TOOLS)
  assert msgs[0]["role"] == "system" and "<tool_call>" in msgs[0]["content"] and '"set_light"' in msgs[0]["content"]

# ------------------------------------------------------------------ the mask on the device
def test_masked_choice_matches_numpy(rng):
  from tinygrad import Tensor, dtypes
  from orin_llm.sampling import masked, greedy, sample, Sampling
  V = 1000
  logits = rng.normal(0, 3, V).astype(np.float32)
  allowed = rng.random(V) < 0.05
  bits = np.zeros((V + 31) // 32 * 32, np.uint8); bits[:V] = allowed
  words = np.packbits(bits, bitorder="little").view(np.uint32)
  m = masked(Tensor(logits), Tensor(words, dtype=dtypes.uint32)).numpy()
  assert m.shape == (1, V) and np.array_equal(m[0], np.where(allowed, logits, -np.inf))
  # rows (a batch): each row by its own mask
  m2 = masked(Tensor(np.stack([logits, -logits])), Tensor(np.stack([words, ~words]), dtype=dtypes.uint32)).numpy()
  assert np.array_equal(m2, np.stack([np.where(allowed, logits, -np.inf), np.where(~allowed, -logits, -np.inf)]))
  ml = masked(Tensor(logits), Tensor(words, dtype=dtypes.uint32))
  assert greedy(ml).item() == int(np.argmax(np.where(allowed, logits, -np.inf)))
  params = Tensor(Sampling(1.0, 0, 0.9, 1).as_list(), dtype=dtypes.float32)
  assert all(allowed[sample(ml, params, i).item()] for i in range(5))

# ------------------------------------------------------------------ the engine's hook
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
  from gguf import GGMLQuantizationType as QT
  from orin_llm.synth import write_model, preset
  from orin_llm.engine import Engine
  from vocab_files import DATA
  path = write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", preset("tiny-llama", n_layers=1), QT.Q4_K, DATA / "ggml-vocab-llama-bpe.gguf",
                     seed=3, types={"token_embd.weight": QT.Q8_0})
  return Engine(path, max_context=256, max_batch=2)

class Spy:
  """A constraint as the engine sees it, checking each choice against the logits its step computed (row `row`)."""
  def __init__(self, c, eng, row=0): self.c, self.eng, self.row, self.want = c, eng, row, []
  def mask_words(self):
    w = self.c.mask_words()
    allowed = np.unpackbits(w.view(np.uint8), bitorder="little")[:self.eng.cfg.vocab_size].astype(bool)
    self.want.append(int(np.argmax(np.where(allowed, self.eng.state.logits[self.row].numpy(), -np.inf))))  # its step has run
    return w
  def advance(self, t):
    assert t == self.want[-1], len(self.want)
    return self.c.advance(t)

def test_engine_constrained_choices(engine, rng):
  """Greedy under a constraint picks the best allowed token of the model's own logits at every step, alone and in a
  batch beside an unconstrained sequence, which gets what it gets alone; sampled choices stay allowed; generation
  ends when the grammar is complete; unconstrained generation is unchanged."""
  from orin_llm.sampling import Sampling
  tok = Tokenizer.from_metadata(engine.file.metadata)
  g = S.Grammars(tok, engine.cfg.vocab_size)
  schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}, "on": {"type": "boolean"}},
            "required": ["n", "on"], "additionalProperties": False}
  prompt, other = tok.encode("JSON please:"), tok.encode("Once upon a time")
  engine.reset()
  free = list(engine.generate(prompt, 6, Sampling(), tok.stop_ids))
  c = g.constraint(S.json_grammar(schema))
  out = list(engine.generate(prompt, 120, Sampling(), tok.stop_ids, constraint=c))
  assert c.done and jsonschema.validate(json.loads(tok.decode(out)), schema) is None
  spy = Spy(g.constraint(S.json_grammar(schema)), engine)
  engine.reset()
  assert list(engine.generate(prompt, 120, Sampling(), tok.stop_ids, constraint=spy)) == out and len(spy.want) == len(out)
  assert not engine.masked_slots  # the slot's mask is all ones again
  engine.reset()
  assert list(engine.generate(prompt, 6, Sampling(), tok.stop_ids)) == free  # the masked steps left the free ones alone
  # a batch: slot 1 constrained, slot 0 not; slot 0's tokens are its tokens alone
  engine.reset()
  alone = list(engine.generate(other, 8, Sampling(), (), slot=0))
  engine.reset()
  spy = Spy(g.constraint(S.json_grammar(schema)), engine, row=0)  # prefill's logits are in row 0
  got0, got1 = [engine.prefill(0, other)], [engine.prefill(1, prompt, mask=spy.mask_words)]
  spy.advance(got1[0]); spy.row = 1  # a batch's rows are its slots
  while not spy.c.done:
    t = engine.decode([0, 1], 1, masks=lambda: {1: spy.mask_words()})
    got0.append(int(t[0, 0])); got1.append(int(t[0, 1]))
    spy.advance(got1[-1])
  assert got0 == alone[:len(got0)] or len(got0) > len(alone) and got0[:len(alone)] == alone
  jsonschema.validate(json.loads(tok.decode(got1)), schema)
  engine.set_mask(1, None)
  for seed in range(3):
    c = g.constraint(S.json_grammar(schema))
    engine.reset()
    out = list(engine.generate(prompt, 120, Sampling(1.0, 0, 0.95, seed), tok.stop_ids, constraint=c))
    jsonschema.validate(json.loads(tok.decode(out)), schema)

def test_warm_up_captures_masked_and_plain_choices(tmp_path):
  """The warm-up runs every choice step a server may need: plain and masked, greedy and sampled, alone and in each
  batch size (a mask left set on a slot must not turn a batch's plain decode into the masked one)."""
  from gguf import GGMLQuantizationType as QT
  from orin_llm.synth import write_model, preset
  from orin_llm.engine import Engine
  from orin_llm.warmup import warm_up
  from vocab_files import DATA
  path = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q4_K, DATA / "ggml-vocab-llama-bpe.gguf", vocab_size=2048)
  eng = Engine(path, max_context=128, chunk=16, max_batch=3)
  warm_up(eng)
  want = {f"choose-{rows}-{kind}{m}" for rows in ["one"] + [f"batch{b}" for b in eng.batch_sizes]
          for kind in ("greedy", "sampled") for m in ("", "-masked")}
  assert want <= set(eng.steps.jits), sorted(want - set(eng.steps.jits))
  assert not eng.masked_slots
