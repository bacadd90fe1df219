"""Chat templates: the Jinja template of a GGUF file (tokenizer.chat_template) rendered as HF transformers does.

A template in a model file is untrusted code, so it runs in Jinja's ImmutableSandboxedEnvironment,
with unsafe attribute access (e.g. ''.__class__) made a hard error instead of an undefined value, and
everything that could build a huge string or number bounded by the output bound: `*`, `**`, `+`, `~`,
%-formatting, str.format widths, center/ljust/rjust/zfill, join, replace and the filters' numeric
arguments; the rendered text itself is bounded as it is produced. Like transformers: trim_blocks,
lstrip_blocks, loop controls, {% generation %} blocks, a tojson filter that keeps non-ASCII,
raise_exception() and strftime_now(), and bos_token/eos_token. A file without a template gets ChatML, as
llama.cpp falls back to.

The server goes further (PromptWorker): rendering and tokenizing run in a child process with a wall-clock
timeout, a CPU-time and an address-space limit, so that a template that loops or allocates in ways the
sandbox does not see costs one 400 and a respawn, never the server. ChatTemplate.encode() tokenizes
message content as plain text: only the template's own markup can make control tokens.
"""
from __future__ import annotations
import functools, json, os, pickle, re, select, signal, string, struct, subprocess, sys, threading, time, types, weakref
from datetime import datetime
from typing import Any
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg
from orin_llm.errors import OrinError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# characters a render may produce, and the bound on every string, list or number a template builds on the way: far above
# any prompt a context holds (a request body is at most 1 MiB), far below what could hurt
MAX_OUTPUT = 4 << 20
MAX_INT_BITS = 1 << 16  # integers a template computes (10 ** 64 ** 64 would take minutes and gigabytes)
# a conversation every template must render within the bounds at load (its own errors, e.g. roles it refuses, are fine)
SAMPLE = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"},
          {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "What is 2+2?"}]

_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")

class TemplateLimit(OrinError):
  """A bound of time or memory was exceeded (in the worker process: it was replaced)."""

def _too_big(what: str, limit: int): raise SecurityError(f"{what} over the limit of {limit}")

class _CodeGen(CodeGenerator):
  # `~` is compiled to a plain join that the sandbox never sees: route its result through a size check
  def visit_Concat(self, node, frame):
    self.write("environment.checked_concat(")
    super().visit_Concat(node, frame)
    self.write(")")

class _Sandbox(ImmutableSandboxedEnvironment):
  code_generator_class = _CodeGen
  # intercepted operators are also never folded at compile time ('%0999999999d' % 1 was, in the parser)
  intercepted_binops = frozenset({"*", "**", "+", "%"})
  max_size = MAX_OUTPUT

  def unsafe_undefined(self, obj, attribute):
    raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed")

  def _weight(self, x) -> int:
    """What a value costs when turned into text, roughly: its length, and for a list its strings' lengths too."""
    if isinstance(x, str): return len(x)
    if isinstance(x, (list, tuple)): return len(x) + sum(len(v) for v in x if isinstance(v, str))
    return 0

  def checked_concat(self, s):
    if isinstance(s, str) and len(s) > self.max_size: _too_big("string built with ~", self.max_size)
    return s

  def call_binop(self, context, operator, left, right):
    lim = self.max_size
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**":
      if isinstance(right, (int, float)) and abs(right) > 64: raise SecurityError("power too large")
      if ints and right > 0 and left.bit_length() * right > MAX_INT_BITS: raise SecurityError("power too large")
    elif operator == "*":
      if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS: raise SecurityError("product too large")
      for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and self._weight(seq) * n > lim: raise SecurityError("repetition too large")
    elif operator == "+":
      if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) and self._weight(left) + self._weight(right) > lim:
        _too_big("string or list built with +", lim)
    elif operator == "%" and isinstance(left, str): self._check_printf(left)
    return super().call_binop(context, operator, left, right)

  def _check_printf(self, fmt: str):
    for width, prec in _PRINTF.findall(fmt):
      for n in (width, prec):
        if n == "*": raise SecurityError("%-format widths from arguments (*) are not allowed")
        if n and (len(n) > 9 or int(n) > self.max_size): _too_big("%-format width", self.max_size)

  def _check_format(self, fmt: str):
    for _, _, spec, _ in string.Formatter().parse(fmt):
      if not spec: continue
      if "{" in spec: raise SecurityError("nested replacement fields in format specs are not allowed")
      if any(len(n) > 9 or int(n) > self.max_size for n in re.findall(r"\d+", spec)): _too_big("format width", self.max_size)

  def call(__self, __context, __obj, *args, **kwargs):
    # str methods that make strings of a size their arguments choose; str.format comes wrapped by the sandbox
    target = getattr(__obj, "__wrapped__", __obj)
    if isinstance(target, types.BuiltinMethodType) and isinstance(target.__self__, str):
      s, name, lim = target.__self__, target.__name__, __self.max_size
      arg = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)
      if name in ("format", "format_map"): __self._check_format(s)
      elif name in ("center", "ljust", "rjust", "zfill"):
        if isinstance(w := arg(0, "width"), int) and w > lim: _too_big(f"str.{name} width", lim)
      elif name == "expandtabs":
        if isinstance(n := arg(0, "tabsize", 8), int) and len(s) + s.count("\t") * n > lim: _too_big("str.expandtabs result", lim)
      elif name == "join" and args:
        items = list(args[0])
        if sum(len(x) for x in items if isinstance(x, str)) + len(s) * len(items) > lim: _too_big("str.join result", lim)
        args = (items, *args[1:])
      elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        n = s.count(args[0]) if args[0] else len(s) + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0: n = min(n, args[2])
        if len(s) + n * (len(args[1]) - len(args[0])) > lim: _too_big("str.replace result", lim)
    return super().call(__context, __obj, *args, **kwargs)

def _bounded_filter(env: _Sandbox, name: str, pre=None):
  """A filter whose numeric arguments (widths, counts) and result are bounded by the output bound; pre(value, args,
  kwargs) checks (and may replace) the value filtered before the filter runs."""
  f = env.filters[name]
  skip = 1 + (_PassArg.from_obj(f) is not None)  # the value filtered, and the context or environment before it
  @functools.wraps(f)
  def g(*args, **kwargs):
    for a in (*args[skip:], *kwargs.values()):
      if isinstance(a, int) and not isinstance(a, bool) and abs(a) > env.max_size: _too_big(f"argument of the {name} filter", env.max_size)
    if pre is not None and len(args) >= skip: args = (*args[:skip - 1], pre(args[skip - 1], args[skip:], kwargs), *args[skip:])
    out = f(*args, **kwargs)
    if isinstance(out, (str, list)) and len(out) > env.max_size: _too_big(f"result of the {name} filter", env.max_size)
    return out
  return g

def _bound_filters(env: _Sandbox):
  lim = env.max_size
  def printf(value, args, kwargs):
    if isinstance(value, str): env._check_printf(value)
    return value
  def join(value, args, kwargs):
    items, sep = list(value), args[0] if args else kwargs.get("d", "")
    if sum(len(x) for x in items if isinstance(x, str)) + len(str(sep)) * len(items) > lim: _too_big("result of the join filter", lim)
    return items
  def indent(value, args, kwargs):
    w = args[0] if args else kwargs.get("width", 4)
    if isinstance(value, str) and len(value) + (value.count("\n") + 1) * (len(w) if isinstance(w, str) else w if isinstance(w, int) else 0) > lim:
      _too_big("result of the indent filter", lim)
    return value
  def replace(value, args, kwargs):
    if isinstance(value, str) and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
      n = value.count(args[0]) if args[0] else len(value) + 1
      if len(value) + n * (len(args[1]) - len(args[0])) > lim: _too_big("result of the replace filter", lim)
    return value
  pres = {"format": printf, "join": join, "indent": indent, "replace": replace}
  for name in ("center", "indent", "format", "join", "replace", "batch", "slice", "wordwrap", "truncate", "list", "string", "pprint"):
    env.filters[name] = _bounded_filter(env, name, pres.get(name))

class _Generation(Extension):
  # transformers' {% generation %}...{% endgeneration %} marks assistant text for training masks; rendering ignores it
  tags = {"generation"}
  def parse(self, parser):
    lineno = next(parser.stream).lineno
    return nodes.Scope(parser.parse_statements(("name:endgeneration",), drop_needle=True), lineno=lineno)

def _raise_exception(message): raise TemplateError(message)
def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  if indent is not None and (len(indent) if isinstance(indent, str) else indent) > 64: raise SecurityError("tojson indent over 64")
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def _strftime_now(fmt): return datetime.now().strftime(fmt)

def _one_line(e: BaseException) -> str:
  if isinstance(e, MemoryError): return "out of memory"
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
  def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "", max_output: int = MAX_OUTPUT):
    self.source = source if source else CHATML
    self.is_fallback = not source
    self.bos_token, self.eos_token, self.max_output = bos_token, eos_token, max_output
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.max_size = max_output
    _bound_filters(env)
    env.filters["tojson"] = _tojson
    env.globals.pop("lipsum", None)  # paragraphs of lorem ipsum, as many as asked for
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try: self._template = env.from_string(self.source)
    except TemplateError as e: raise OrinError(f"chat template does not compile: {_one_line(e)}" + (f" (line {e.lineno})" if getattr(e, "lineno", None) else "")) from None
    except Exception as e: raise OrinError(f"chat template does not compile: {_one_line(e)}") from None  # deep nesting, memory

  @staticmethod
  def parts(md: dict) -> tuple[str | None, str, str]:
    """(source, bos_token, eos_token) of a model file's template."""
    tokens = md.get("tokenizer.ggml.tokens") or []
    def text(key):
      i = md.get(key)
      return tokens[i] if type(i) is int and 0 <= i < len(tokens) and isinstance(tokens[i], str) else ""
    source = md.get("tokenizer.chat_template")
    if source is not None and not isinstance(source, str): raise OrinError(f"tokenizer.chat_template must be a string, not {type(source).__name__}")
    return source, text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id")

  @classmethod
  def from_metadata(cls, md: dict, max_output: int = MAX_OUTPUT) -> ChatTemplate: return cls(*cls.parts(md), max_output=max_output)

  def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None, **variables: Any) -> str:
    """The prompt text for messages ([{'role': ..., 'content': ...}, ...]); tools (OpenAI's [{"type": "function",
    "function": {...}}]) and other variables go to the template; tools=None leaves `tools` undefined, as templates
    without tools expect. The text may begin with bos_token: encode it with bos=False then."""
    if tools is not None: variables["tools"] = tools
    def bounded(pieces):
      n = 0
      for p in pieces:
        n += len(p)
        if n > self.max_output: _too_big("rendered text (characters)", self.max_output)
        yield p
    try:
      return "".join(bounded(self._template.generate(messages=_for_template(messages), add_generation_prompt=add_generation_prompt,
                                                      bos_token=self.bos_token, eos_token=self.eos_token, **variables)))
    except OrinError: raise
    except MemoryError: raise TemplateLimit("chat template: out of memory") from None
    except Exception as e: raise OrinError(f"chat template: {_one_line(e)}") from None

  def encode(self, tok, messages: list[dict], add_generation_prompt: bool = True, content_as_text: bool = True,
             max_tokens: int | None = None, **variables: Any) -> list[int]:
    """The prompt's token ids: the template's markup parsed for special tokens, message content (every string in
    messages and variables) encoded as plain text, so that a user cannot write a control token (content_as_text=False:
    parsed as well, as llama.cpp and transformers do). max_tokens: raises tokenizer.TooLong past it."""
    table: dict[int, str] = {}
    if content_as_text: (messages, variables), table = tok.as_text((messages, variables), self.source)
    text = self.render(messages, add_generation_prompt, **variables)
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else None
    return tok.encode(text, bos=False if bos and text.startswith(bos) else None, literal=table, max_tokens=max_tokens)

# ---------------------------------------------------------------------- the worker process
_FRAME = struct.Struct("<Q")
MAX_REPLY = 64 << 20  # bytes of one reply from the worker; more means it is broken
START_TIMEOUT = 120.0  # the worker's start: an interpreter, the tokenizer unpickled (0.6 s for Llama 3's here)

def _vm_bytes() -> int:
  try:
    with open("/proc/self/status") as f:
      return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
  except (OSError, StopIteration, ValueError): return 0

def _read_frame(f) -> bytes | None:
  head = f.read(_FRAME.size)
  if len(head) < _FRAME.size: return None
  return f.read(_FRAME.unpack(head)[0])

def _worker_main():
  """The child: one init frame (pickled: template parts, tokenizer, bounds), then requests until stdin closes. Replies
  are JSON, never pickle: this process runs code from the model file, the parent must not trust what it sends."""
  import resource
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the server's to handle; it closes stdin
  rd, wr = sys.stdin.buffer, sys.stdout.buffer
  def reply(obj):
    data = json.dumps(obj).encode()
    wr.write(_FRAME.pack(len(data)) + data); wr.flush()
  init = pickle.loads(_read_frame(rd))
  tok, timeout = init["tok"], init["timeout"]
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU dumps core by default
  if init["memory"] and (vm := _vm_bytes()):  # (Linux: where /proc tells the address space in use)
    # the address space now (interpreter, tokenizer) plus the budget: a template that allocates past it gets MemoryError
    resource.setrlimit(resource.RLIMIT_AS, (vm + init["memory"], resource.getrlimit(resource.RLIMIT_AS)[1]))
  try: tmpl, error = ChatTemplate(init["source"], init["bos"], init["eos"], init["max_output"]), None
  except OrinError as e: tmpl, error = None, str(e)
  reply({"ready": True, "error": error})
  while (frame := _read_frame(rd)) is not None:
    req = pickle.loads(frame)
    # CPU time as a backstop for the parent's wall clock: a worker left spinning (its parent gone) is killed by SIGXCPU
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    resource.setrlimit(resource.RLIMIT_CPU, (int(used + 2 * timeout + 2), resource.RLIM_INFINITY))
    try:
      if req["op"] == "chat":
        if tmpl is None: raise OrinError(error)
        ids = tmpl.encode(tok, req["messages"], req["add_generation_prompt"], req["content_as_text"], req["max_tokens"], **req["variables"])
      else: ids = tok.encode(req["text"], max_tokens=req["max_tokens"])
      reply({"ids": ids})
    except (MemoryError, TemplateLimit):
      reply({"error": "out of memory", "kind": "memory"})
      return  # start afresh: the parent replaces this process
    except Exception as e:
      from orin_llm.tokenizer import TooLong
      if isinstance(e, TooLong): reply({"error": str(e), "kind": "too_long", "tokens": e.tokens, "limit": e.limit})
      elif isinstance(e, OrinError): reply({"error": str(e), "kind": "template"})
      else: reply({"error": f"chat template: {_one_line(e)}", "kind": "template"})

def _kill(proc: subprocess.Popen):
  if proc.poll() is None:
    proc.kill()
    proc.wait()
  for f in (proc.stdin, proc.stdout):
    try: f.close()
    except OSError: pass

class PromptWorker:
  """Chat templates rendered and prompts tokenized in a child process, bounded in wall-clock time (timeout s per
  request: the worker is killed and replaced), memory (memory_mb of address space above its start) and output
  (max_output characters, also the sandbox's bound on what a template builds). The template is compiled once per
  worker; a worker is a fresh interpreter (never a fork of the threaded server). Blocking and thread-safe: the
  server calls it through asyncio.to_thread, one request at a time. At start a sample conversation must render
  within the bounds, or the template is refused with OrinError."""
  def __init__(self, template: tuple[str | None, str, str], tok, timeout: float = 5.0, memory_mb: int = 256,
               max_output: int = MAX_OUTPUT, content_as_text: bool = True):
    self.tok, self.timeout, self.content_as_text = tok, timeout, content_as_text
    source, bos, eos = template
    self._init = pickle.dumps({"source": source, "bos": bos, "eos": eos, "max_output": max_output, "tok": tok,
                               "timeout": timeout, "memory": memory_mb << 20})
    self.memory_mb, self.max_output = memory_mb, max_output
    self._lock, self._proc, self.error, self.restarts, self._closed = threading.Lock(), None, None, 0, False
    with self._lock: self._start()
    try: self.chat(SAMPLE)
    except TemplateLimit as e:
      self.close()
      raise OrinError(f"the model's chat template is refused: on a sample conversation, {str(e).removeprefix('chat template: ')}") from None
    except OrinError: pass  # the template's own errors (a role it refuses, ...) are for requests to meet

  @classmethod
  def from_metadata(cls, md: dict, tok, **kw) -> PromptWorker: return cls(ChatTemplate.parts(md), tok, **kw)

  def _start(self):
    code = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from orin_llm.chat import _worker_main; _worker_main()"
    # sys.path travels along: under Nix the interpreter alone does not find the packages (as multiprocessing's spawn does)
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(sys.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    self._proc = proc
    weakref.finalize(self, _kill, proc)
    try:
      proc.stdin.write(_FRAME.pack(len(self._init)) + self._init); proc.stdin.flush()
      r = self._reply(START_TIMEOUT)
    except (OSError, TemplateLimit) as e:
      self._drop()
      raise OrinError(f"the chat template worker did not start: {e}") from None
    self.error = r.get("error")

  def _drop(self):
    if self._proc is not None: _kill(self._proc)
    self._proc = None

  def _reply(self, timeout: float) -> dict:
    """The next reply, waiting at most timeout seconds; kills the worker past it or when it dies."""
    proc, deadline, buf, need = self._proc, time.monotonic() + timeout, b"", _FRAME.size
    fd = proc.stdout.fileno()
    while len(buf) < need:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        self._drop()
        raise TemplateLimit(f"chat template: rendering and tokenizing took over {timeout:g} s (template_timeout), stopped")
      chunk = os.read(fd, min(need - len(buf), 1 << 20))
      if not chunk:
        code = proc.wait()
        self._drop()
        why = {-signal.SIGXCPU: "its CPU time", -signal.SIGKILL: "its memory or was killed"}.get(code, f"exit status {code}")
        raise TemplateLimit(f"chat template: the worker process stopped ({why}), restarted")
      buf += chunk
      if need == _FRAME.size and len(buf) == need:
        need += _FRAME.unpack(buf)[0]
        if need > MAX_REPLY: self._drop(); raise TemplateLimit("chat template: the worker process sent a reply too large, restarted")
    return json.loads(buf[_FRAME.size:])

  def _call(self, req: dict) -> list[int]:
    try:
      with self._lock:
        if self._proc is None: self._start(); self.restarts += 1
        data = pickle.dumps(req)
        try:
          self._proc.stdin.write(_FRAME.pack(len(data)) + data); self._proc.stdin.flush()
        except OSError:
          self._drop()
          raise TemplateLimit("chat template: the worker process stopped, restarted") from None
        r = self._reply(self.timeout)
        if r.get("kind") == "memory":
          self._drop()
          raise TemplateLimit(f"chat template: rendering and tokenizing needed over {self.memory_mb} MiB (template_memory_mb), stopped")
    finally:
      # a worker killed for a bound is replaced at once, so that the next request does not wait for an interpreter
      if self._proc is None: threading.Thread(target=self._respawn, daemon=True).start()
    if "ids" in r: return r["ids"]
    if r.get("kind") == "too_long":
      from orin_llm.tokenizer import TooLong
      raise TooLong(r["tokens"], r["limit"])
    raise OrinError(r["error"])

  def _respawn(self):
    with self._lock:
      if self._proc is None and not self._closed:
        try: self._start(); self.restarts += 1
        except OrinError: pass  # the next request tries again, and reports

  def chat(self, messages: list[dict], add_generation_prompt: bool = True, max_tokens: int | None = None, **variables) -> list[int]:
    """ChatTemplate.encode in the worker (content as text unless the worker was made with content_as_text=False)."""
    return self._call({"op": "chat", "messages": messages, "add_generation_prompt": add_generation_prompt, "variables": variables,
                       "content_as_text": self.content_as_text, "max_tokens": max_tokens})

  def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
    """Tokenizer.encode (BOS as the model says, special tokens parsed: a raw prompt) in the worker."""
    return self._call({"op": "encode", "text": text, "max_tokens": max_tokens})

  def close(self):
    with self._lock:
      self._closed = True
      self._drop()
