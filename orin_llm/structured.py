"""Structured output: decoding constrained to a JSON schema or a grammar, and tool calls.

Grammars are llguidance's (the engine llama.cpp, vLLM and SGLang use: Rust, an Earley parser over
lexemes, a token trie, a numpy bitmask per step, no torch). Its vocabulary is built from the GGUF
file's through our tokenizer (`Grammars`), so that a token's bytes are the bytes we decode it to.
A `Constraint` is one generation's grammar state and the engine's hook: before each token it gives the
allowed-token bitmask (mask_words), after it takes the chosen token (advance). The engine takes the bitmasks
through callbacks (Engine.prefill_chunks(mask=), Engine.decode(masks=); the server's scheduler, worker.py) or
drives a Constraint itself (Engine.generate(constraint=)).

Tool calls follow the model's own format, chosen by its chat template (`tool_format`):
- "llama3" (LLaMA 3.1/3.2 templates): the whole answer is `{"name": ..., "parameters": {...}}`,
  one call per turn (the template refuses to render two);
- "hermes" (Qwen2.5/Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one or more, after optional text;
- "generic": a template that does not render tools gets them described in the system message
  (in the hermes format, which `<tool_call>` then spells as text).
"""
from __future__ import annotations
import json, re, secrets, threading
import numpy as np
from orin_llm.errors import OrinError
from orin_llm.tokenizer import CONTROL, UNKNOWN, USER_DEFINED

class GrammarError(OrinError):
  """A schema or grammar that constrained decoding cannot follow; the message names the part."""

# JSON whitespace between tokens: none, a space, or a line break and an indent (llama.cpp's bound).
# Unbounded whitespace lets a model pad forever where it cannot decide what comes next.
WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"

def whitespace() -> dict:
  """llguidance's JSON options for WHITESPACE (from llguidance 1.8, which matches the pattern once where whitespace
  may go; 1.7 repeated it without bound, and its matcher stops differently: pyproject asks for 1.8)."""
  return {"whitespace_pattern": WHITESPACE}

def _ll():
  try: import llguidance, llguidance.numpy
  except ImportError: raise OrinError("structured output needs the llguidance package (pip install llguidance)") from None
  return llguidance

# ---------------------------------------------------------------------- vocabulary and constraints
class _Vocab:
  """Our tokenizer as llguidance.TokenizerWrapper reads it: each token's bytes, control tokens (and user-defined
  ones that look like them, e.g. Qwen's <tool_call>) as 0xFF + their text, which llguidance treats as special
  tokens that grammars name as <...> and that never match text (as llama.cpp's bridge does)."""
  def __init__(self, tok, n_vocab: int):
    self.tok, self.eos_token_id, self.bos_token_id = tok, tok.eos_id, tok.bos_id
    self.tokens = [b"\xff" + t.encode() if special_like(tok, i) else tok.piece(i) for i, t in enumerate(tok.tokens)]
    self.tokens += [b""] * (n_vocab - len(self.tokens))  # logits past the vocabulary: ids no text decodes to
    self.special_token_ids = [i for i in range(tok.vocab_size) if special_like(tok, i)]
  def __call__(self, text: str | bytes) -> list[int]:
    # llguidance tokenizes forced text with this; as plain text (special=False), like a model's output
    if isinstance(text, bytes): text = text.decode("utf-8", errors="replace")
    return self.tok.encode(text, bos=False, special=False)

def special_like(tok, i: int) -> bool:
  t = tok._types[i]
  return t in (CONTROL, UNKNOWN) or (t == USER_DEFINED and tok.tokens[i].startswith("<") and tok.tokens[i].endswith(">"))

class Grammars:
  """llguidance's view of one model's vocabulary (built once, ~0.6 s for 128k tokens) and constraints over it.
  n_vocab: the logits' length (the model's vocab_size, which may exceed the tokenizer's)."""
  def __init__(self, tok, n_vocab: int):
    self.tok, self.n_vocab = tok, n_vocab
    self._ll, self._lock = None, threading.Lock()
    self._special = {t: i for i, t in enumerate(tok.tokens) if special_like(tok, i)}
  def lltok(self):
    with self._lock:
      if self._ll is None:
        ll = _ll()
        # every end-of-generation token may end a grammar that is complete
        self._ll = ll.LLTokenizer(ll.TokenizerWrapper(_Vocab(self.tok, self.n_vocab)), n_vocab=self.n_vocab,
                                  eos_token=sorted(self.tok.stop_ids) or None)
      return self._ll
  def has_token(self, text: str) -> bool:
    """Whether text is one special token of the vocabulary (a grammar then names it <text>)."""
    return text in self._special
  def constraint(self, grammar: str, where: str = "grammar", schema=None) -> Constraint:
    """A fresh Constraint for an llguidance grammar (from json_grammar, lark, tool_grammar); GrammarError when
    llguidance refuses it. where/schema name the request's part in the message."""
    ll = _ll()
    err, msgs = ll.LLMatcher.validate_grammar_with_warnings(grammar, self.lltok())
    if err: raise GrammarError(_explain(where, msgs[0] if msgs else "invalid grammar", schema))
    m = ll.LLMatcher(self.lltok(), grammar, log_level=0)
    if m.is_error(): raise GrammarError(_explain(where, m.get_error(), schema))
    return Constraint(m, self.n_vocab)

class Constraint:
  """One generation's grammar state: the engine's hook.
  mask_words() -> the next token's allowed set as uint32 words (token i allowed iff bit i % 32 of word i // 32
                  is set: llguidance's bitmask), or None when every token is allowed;
  advance(id) -> consumes the token the engine chose; True when the grammar is complete (no token may follow),
                 which ends the generation without an end-of-turn token.
  A token the mask forbade, or a grammar that allows nothing, raises OrinError (the request fails)."""
  def __init__(self, matcher, n_vocab: int):
    self.m, self.n_vocab = matcher, n_vocab
    self._mask = np.full((1, (n_vocab + 31) // 32), -1, np.int32)
    self.done = False
  def mask_words(self) -> np.ndarray | None:
    import llguidance.numpy as lln
    lln.fill_next_token_bitmask(self.m, self._mask)
    if self.m.is_error(): raise OrinError(f"constrained decoding failed: {_first_line(self.m.get_error())}")
    w = self._mask[0]
    if not w.any(): raise OrinError("constrained decoding: the grammar allows no next token (a schema no value satisfies?)")
    return w.view(np.uint32)
  def advance(self, token_id: int) -> bool:
    if not self.m.consume_token(int(token_id)):
      raise OrinError(f"constrained decoding: token {token_id} is not allowed here ({_first_line(self.m.get_error())})")
    self.done = self.m.is_stopped()
    return self.done
  def allowed(self, token_id: int) -> bool:
    """Whether the last mask_words() allowed token_id (tests)."""
    return bool((int(self._mask[0, token_id >> 5]) >> (token_id & 31)) & 1)

class AllowAll:
  """A Constraint that allows every token and never completes: runs the engine's masked steps (the warm-up)."""
  def __init__(self, n_vocab: int): self.words, self.done = np.full((n_vocab + 31) // 32, 0xFFFFFFFF, np.uint32), False
  def mask_words(self) -> np.ndarray: return self.words
  def advance(self, token_id: int) -> bool: return False

def _first_line(s: str) -> str: return (s.strip().splitlines() or ["?"])[0]

# ---------------------------------------------------------------------- JSON schemas
def close_objects(schema):
  """The schema with `additionalProperties: false` on each object schema that lists properties and says nothing
  of others (OpenAI's strict mode requires it spelled out; here it is the default under strict). Left alone:
  schemas combined with allOf/anyOf/oneOf/$ref, whose members close nothing on their own."""
  if isinstance(schema, list): return [close_objects(s) for s in schema]
  if not isinstance(schema, dict): return schema
  out = {}
  for k, v in schema.items():
    if k in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
      out[k] = {n: close_objects(s) for n, s in v.items()} if isinstance(v, dict) else v
    elif k in ("items", "prefixItems", "anyOf", "oneOf", "additionalProperties", "contains", "not"): out[k] = close_objects(v)
    else: out[k] = v  # allOf members and anything else as given
  if "properties" in out and not any(k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties",
                                                          "allOf", "anyOf", "oneOf", "$ref")):
    out["additionalProperties"] = False
  return out

def json_grammar(schema: dict, strict: bool = True) -> str:
  """An llguidance grammar for JSON values valid under schema; a keyword it cannot enforce is an error (GrammarError
  at Grammars.constraint), never ignored, so that every answer validates. strict: objects that say nothing of other
  keys are closed (close_objects), as OpenAI's strict mode requires them to be."""
  ll = _ll()
  try: return ll.LLMatcher.grammar_from_json_schema(close_objects(schema) if strict else schema, defaults=whitespace())
  except (ValueError, TypeError) as e: raise GrammarError(f"the schema is not valid: {e}") from None

def json_lark(schema, strict: bool = True) -> str:
  """A lark rule body (`%json {...}`) for JSON values valid under schema, as json_grammar's, inside a larger grammar."""
  if isinstance(schema, dict):
    if strict: schema = close_objects(schema)
    schema = {**schema, "x-guidance": {**whitespace(), **schema.get("x-guidance", {})}}
  return f"%json {json.dumps(schema)}"

def _explain(where: str, msg: str, schema) -> str:
  """llguidance's message, on one line, with the JSON pointers in schema of the keywords it names."""
  one = " ".join(l.strip() for l in msg.strip().splitlines() if l.strip() and set(l.strip()) != {"^"})
  at = _where(schema, msg) if isinstance(schema, (dict, list)) else []
  return f"{where} cannot be enforced: {one}" + (f" (at {', '.join('#' + p for p in at[:4])})" if at else "")

def _where(schema, msg: str) -> list[str]:
  keys = set(re.findall(r'"([^"]+)"', m.group(1))) if (m := re.search(r"Unimplemented keys: \[(.*?)\]", msg)) else set()
  fmt = m.group(1) if (m := re.search(r"Unknown format: (\S+)", msg)) else None
  typ = m.group(1) if (m := re.search(r"Invalid type: (\S+)", msg)) else None
  ref = m.group(1) if (m := re.search(r"Pointer '([^']*)' does not exist", msg)) else None
  hits = []
  def walk(node, path):
    if isinstance(node, dict):
      for k, v in node.items():
        p = f"{path}/{k.replace('~', '~0').replace('/', '~1')}"
        if k in keys or (k == "format" and v == fmt) or (k == "type" and typ is not None and (v == typ or (isinstance(v, list) and typ in v))) \
           or (k == "$ref" and ref is not None and isinstance(v, str) and v.endswith(ref)) \
           or (k == "pattern" and isinstance(v, str) and v and v in msg): hits.append(p)
        walk(v, p)
    elif isinstance(node, list):
      for i, v in enumerate(node): walk(v, f"{path}/{i}")
  walk(schema, "")
  return hits

# ---------------------------------------------------------------------- tool calls
def new_call_id() -> str: return "call_" + secrets.token_hex(12)

_NAME_RE = re.compile(r"^\s*\{\s*\"name\"\s*:\s*\"((?:[^\"\\]|\\.)*)\"\s*,\s*\"(?:arguments|parameters)\"\s*:\s*", re.S)

def _value_end(s: str, i: int) -> int | None:
  """Where the JSON object or array starting at s[i] ends (the index after it), None if it has not ended."""
  depth, in_str, esc = 0, False, False
  for j in range(i, len(s)):
    c = s[j]
    if in_str:
      if esc: esc = False
      elif c == "\\": esc = True
      elif c == '"': in_str = False
    elif c == '"': in_str = True
    elif c in "{[": depth += 1
    elif c in "}]":
      depth -= 1
      if depth == 0: return j + 1
  return None

def _one_call(body: str) -> tuple[dict, int] | None:
  """{"name", "arguments" (the JSON text as written)} of the call object at the start of body, and where it ends."""
  if (m := _NAME_RE.match(body)) and m.end() < len(body) and body[m.end()] == "{" and (e := _value_end(body, m.end())) is not None:
    close = re.compile(r"\s*\}").match(body, e)
    try: name, args = json.loads(f'"{m.group(1)}"'), json.loads(body[m.end():e])
    except ValueError: return None
    if close and isinstance(args, dict): return {"name": name, "arguments": body[m.end():e]}, close.end()
  try: obj, end = json.JSONDecoder().raw_decode(body.lstrip())
  except ValueError: return None
  end += len(body) - len(body.lstrip())
  if not isinstance(obj, dict) or not isinstance(obj.get("name"), str): return None
  args = obj.get("arguments", obj.get("parameters", {}))
  if isinstance(args, str):
    try: args = json.loads(args)
    except ValueError: return None
  if not isinstance(args, dict): return None
  return {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}, end

class ToolFormat:
  """A family's tool-call syntax: the grammar that produces calls, and the parser that reads them back."""
  name = "?"
  def __init__(self, grammars: Grammars | None = None): self.g = grammars
  def _lit(self, text: str) -> str:
    # a special token where the vocabulary has it as one (Qwen's <tool_call>), else the text
    return text if self.g is not None and self.g.has_token(text) else json.dumps(text)
  def grammar(self, tools: list[dict], parallel: bool) -> str: raise NotImplementedError
  def parse(self, text: str) -> tuple[str, list[dict]] | None: raise NotImplementedError
  def _functions(self, tools: list[dict], key: str) -> str:
    """Lark rules `fn: <"name": ..., "key": > %json{parameters}`, one alternative per tool."""
    rules = []
    for i, t in enumerate(tools):
      f = t["function"]
      head = "{" + json.dumps("name") + ": " + json.dumps(f["name"]) + ", " + json.dumps(key) + ": "
      rules.append(f"fn_{i}: {json.dumps(head)} {json_lark(f.get('parameters') or {'type': 'object', 'properties': {}})} \"}}\"")
    return "fn: " + " | ".join(f"fn_{i}" for i in range(len(tools))) + "\n" + "\n".join(rules) + "\n"

class Llama3(ToolFormat):
  """LLaMA 3.1/3.2: the answer is one JSON object {"name": ..., "parameters": {...}} (a leading <|python_tag|>,
  a control token, decodes to nothing); a template renders one call per assistant turn."""
  name = "llama3"
  def grammar(self, tools, parallel):
    return "start: fn\n" + self._functions(tools, "parameters")
  def parse(self, text):
    s, calls = text.strip(), []
    if not s.startswith("{"): return None
    while s:
      if (one := _one_call(s)) is None: return None
      calls.append(one[0])
      s = s[one[1]:].lstrip().lstrip(";").lstrip()  # vLLM's llama3 parser also takes calls separated by ';'
    return "", calls

class Hermes(ToolFormat):
  """Qwen2.5/Qwen3, Hermes: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one per line."""
  name = "hermes"
  OPEN, CLOSE = "<tool_call>", "</tool_call>"
  def grammar(self, tools, parallel):
    call = f'call: {self._lit(self.OPEN)} "\\n" fn "\\n" {self._lit(self.CLOSE)}\n'
    return ('start: call ("\\n" call)*\n' if parallel else "start: call\n") + call + self._functions(tools, "arguments")
  def parse(self, text):
    i = text.find(self.OPEN)
    if i < 0: return None
    content, calls, pos = text[:i].rstrip(), [], i
    while (pos := text.find(self.OPEN, pos)) >= 0:
      body_start = pos + len(self.OPEN)
      end = text.find(self.CLOSE, body_start)
      body = text[body_start:end if end >= 0 else len(text)]
      if (one := _one_call(body)) is None or body[one[1]:].strip(): return None
      calls.append(one[0])
      if end < 0: break
      pos = end + len(self.CLOSE)
    return content, calls

class Generic(Hermes):
  """A template that renders no tools: the tools and the hermes format described in the system message."""
  name = "generic"
  def system_text(self, tools: list[dict]) -> str:
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) +
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
  def messages(self, messages: list[dict], tools: list[dict]) -> list[dict]:
    if messages and messages[0].get("role") == "system":
      return [{**messages[0], "content": messages[0]["content"] + "\n\n" + self.system_text(tools)}] + messages[1:]
    return [{"role": "system", "content": self.system_text(tools)}] + messages

def tool_format(template_source: str, grammars: Grammars | None = None) -> ToolFormat:
  """The tool-call family of a chat template, by the markers its source uses."""
  src = template_source or ""
  if "tools" in src and "<tool_call>" in src: return Hermes(grammars)
  if "tools" in src and "<|start_header_id|>" in src: return Llama3(grammars)
  return Generic(grammars)

# ---------------------------------------------------------------------- streaming
class ToolStream:
  """Generated text in, chat deltas out: {"content": text} for text, and each tool call as OpenAI streams it
  ({"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]} once its name is known, then
  {"tool_calls": [{"index", "function": {"arguments": fragment}}]} as its arguments arrive). Text that may begin a
  call is held back until it is clear. finish() flushes; `calls` holds the calls sent (name, arguments)."""
  def __init__(self, fmt: ToolFormat):
    self.fmt, self.buf, self.calls, self.sent_content = fmt, "", [], False
    self.state = "start"  # start (llama3: before the first non-space), text, call (inside one), after (between calls)
    self.args_at = None  # where the current call's arguments start in buf, and how much of them went out
    self.args_sent = 0
  def push(self, text: str) -> list[dict]:
    self.buf += text
    return self._run(False)
  def finish(self) -> list[dict]: return self._run(True)

  def _content(self, s: str) -> list[dict]:
    if not s: return []
    self.sent_content = True
    return [{"content": s}]

  def _run(self, final: bool) -> list[dict]:
    out, hermes = [], isinstance(self.fmt, Hermes)
    while True:
      if self.state == "start":
        s = self.buf.lstrip()
        if not s and not final: return out
        if not hermes and s.startswith("{"): self.buf, self.state = s, "call"; continue
        self.state = "text"; continue
      if self.state in ("text", "after"):
        if not hermes:  # llama3: text that did not start as a call is text, to the end
          if self.state == "after":
            s = self.buf.lstrip().lstrip(";").lstrip()
            if not s: return out if not final else out
            if s.startswith("{"): self.buf, self.state = s, "call"; continue
          out += self._content(self.buf); self.buf = ""; return out
        i = self.buf.find(Hermes.OPEN)
        if i < 0:
          # held back: what may begin <tool_call>, and trailing whitespace, which a call would strip from the text
          keep = 0
          if not final:
            keep = next((k for k in range(min(len(Hermes.OPEN) - 1, len(self.buf)), 0, -1) if self.buf.endswith(Hermes.OPEN[:k])), 0)
            rest = self.buf[:len(self.buf) - keep]
            keep += len(rest) - len(rest.rstrip())
          if self.state == "text": out += self._content(self.buf[:len(self.buf) - keep])
          self.buf = self.buf[len(self.buf) - keep:]  # text after a call (its line break) is dropped
          return out
        if self.state == "text": out += self._content(self.buf[:i].rstrip())
        self.buf, self.state = self.buf[i + len(Hermes.OPEN):], "call"
        continue
      # state == "call": the body of one call, in buf
      if self.args_at is None:
        m = _NAME_RE.match(self.buf)
        if m is None or m.end() >= len(self.buf):
          if final: return out + self._fallback()
          return out
        if self.buf[m.end()] != "{":
          if final: return out + self._fallback()
          return out
        try: name = json.loads(f'"{m.group(1)}"')
        except ValueError: return out + (self._fallback() if final else [])
        self.calls.append({"name": name, "arguments": ""})
        out.append({"tool_calls": [{"index": len(self.calls) - 1, "id": new_call_id(), "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})
        self.args_at, self.args_sent = m.end(), 0
      end = _value_end(self.buf, self.args_at)
      upto = end if end is not None else len(self.buf)
      frag = self.buf[self.args_at + self.args_sent:upto]
      if frag:
        self.args_sent += len(frag)
        self.calls[-1]["arguments"] += frag
        out.append({"tool_calls": [{"index": len(self.calls) - 1, "function": {"arguments": frag}}]})
      if end is None: return out
      rest = self.buf[end:]
      if hermes:
        j = rest.find(Hermes.CLOSE)
        if j < 0 and not final: return out
        self.buf = rest[j + len(Hermes.CLOSE):] if j >= 0 else ""
      else:
        close = re.compile(r"\s*\}").match(rest)
        if close is None and not final: return out
        self.buf = rest[close.end():] if close else ""
      self.args_at, self.state = None, "after"

  def _fallback(self) -> list[dict]:
    """At the end, a call whose start did not match the streamed layout: parsed whole, or sent as text."""
    text, self.buf = self.buf, ""
    one = _one_call(text.removesuffix(Hermes.CLOSE) if isinstance(self.fmt, Hermes) else text)
    if one is None: return self._content((Hermes.OPEN if isinstance(self.fmt, Hermes) else "") + text)
    self.calls.append(one[0])
    return [{"tool_calls": [{"index": len(self.calls) - 1, "id": new_call_id(), "type": "function",
                             "function": {"name": one[0]["name"], "arguments": one[0]["arguments"]}}]}]
