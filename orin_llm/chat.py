"""Chat templates: the Jinja template of a GGUF file (tokenizer.chat_template) rendered as HF transformers does.

A template in a model file is untrusted code, so it runs in Jinja's ImmutableSandboxedEnvironment,
with unsafe attribute access (e.g. ''.__class__) made a hard error instead of an undefined value, and
string/list repetition and powers bounded. Like transformers: trim_blocks, lstrip_blocks, loop controls,
{% generation %} blocks, a tojson filter that keeps non-ASCII, raise_exception() and strftime_now(),
and bos_token/eos_token. A file without a template gets ChatML, as llama.cpp falls back to.
"""
from __future__ import annotations
import json
from datetime import datetime
from typing import Any
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from orin_llm.errors import OrinError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MAX_REPEAT = 1 << 20  # longest string or list a template may build with * (a bound on memory, not a limit real templates meet)

class _Sandbox(ImmutableSandboxedEnvironment):
  intercepted_binops = frozenset({"*", "**"})
  def unsafe_undefined(self, obj, attribute):
    raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed")
  def call_binop(self, context, operator, left, right):
    if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64: raise SecurityError("power too large")
    if operator == "*":
      for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT: raise SecurityError("repetition too large")
    return super().call_binop(context, operator, left, right)

class _Generation(Extension):
  # transformers' {% generation %}...{% endgeneration %} marks assistant text for training masks; rendering ignores it
  tags = {"generation"}
  def parse(self, parser):
    lineno = next(parser.stream).lineno
    return nodes.Scope(parser.parse_statements(("name:endgeneration",), drop_needle=True), lineno=lineno)

def _raise_exception(message): raise TemplateError(message)
def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def _strftime_now(fmt): return datetime.now().strftime(fmt)

def _one_line(e: Exception) -> str:
  msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
  return msg if isinstance(e, TemplateError) else f"{type(e).__name__}: {msg}"

def _for_template(messages: list[dict]) -> list[dict]:
  """Tool calls' arguments as objects: OpenAI sends them as JSON text, templates (LLaMA 3.1's `arguments | tojson`)
  expect what transformers passes, a mapping; text that is not JSON stays text."""
  out = []
  for m in messages:
    if isinstance(m, dict) and isinstance(m.get("tool_calls"), list):
      calls = []
      for c in m["tool_calls"]:
        f = c.get("function") if isinstance(c, dict) else None
        if isinstance(f, dict) and isinstance(f.get("arguments"), str):
          try: c = {**c, "function": {**f, "arguments": json.loads(f["arguments"])}}
          except ValueError: pass
        calls.append(c)
      m = {**m, "tool_calls": calls}
    out.append(m)
  return out

class ChatTemplate:
  def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = ""):
    self.source = source if source else CHATML
    self.is_fallback = not source
    self.bos_token, self.eos_token = bos_token, eos_token
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try: self._template = env.from_string(self.source)
    except TemplateError as e: raise OrinError(f"chat template does not compile: {_one_line(e)}" + (f" (line {e.lineno})" if getattr(e, "lineno", None) else "")) from None

  @classmethod
  def from_metadata(cls, md: dict) -> ChatTemplate:
    tokens = md.get("tokenizer.ggml.tokens") or []
    def text(key):
      i = md.get(key)
      return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""
    return cls(md.get("tokenizer.chat_template"), text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id"))

  def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None, **variables: Any) -> str:
    """The prompt text for messages ([{'role': ..., 'content': ...}, ...]); tools (OpenAI's [{"type": "function",
    "function": {...}}]) and other variables go to the template; tools=None leaves `tools` undefined, as templates
    without tools expect. The text may begin with bos_token: encode it with bos=False then."""
    if tools is not None: variables["tools"] = tools
    try:
      return self._template.render(messages=_for_template(messages), add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token, eos_token=self.eos_token, **variables)
    except OrinError: raise
    except Exception as e: raise OrinError(f"chat template: {_one_line(e)}") from None
