"""The HTTP API (aiohttp): OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus
/health and /metrics. Requests are checked here, on the event loop; chat templates and tokenizing run
in the prompt worker process (chat.PromptWorker, reached through a thread), generation on the engine
thread (worker.py). Anything a client sends that is wrong gets OpenAI's error object
({"error": {"message", "type", "param", "code"}}) with a 4xx status, never a 500. ConnectionGuard bounds
the connections, and how long a client may take to send a request or stay idle."""
from __future__ import annotations
import asyncio, hmac, json, logging, os, pathlib, re, time, uuid
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from orin_llm.errors import OrinError
from orin_llm.tokenizer import TooLong
from orin_llm.sampling import Sampling
from orin_llm.server.config import ServerConfig
from orin_llm.server.metrics import Metrics
from orin_llm.server.worker import Job, QueueFull, Reading, Worker

logger = logging.getLogger("orin_llm.server")
MAX_BODY_BYTES = 1 << 20  # far above any prompt that fits a Jetson's context, far below what could hurt
MAX_STOP = 16
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # \ud800-\udfff: valid only in pairs

class APIError(Exception):
  def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, headers: dict | None = None, close: bool = False):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code, self.headers, self.close = status, message, type, param, code, headers, close
  def response(self) -> web.Response:
    r = web.json_response(self.body(), status=self.status, headers=self.headers)
    if self.close: r.force_close()  # Connection: close
    return r
  def body(self) -> dict: return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

class Server:
  """What the handlers share: configuration, the engine thread, metrics, the model's name and chat template."""
  def __init__(self, cfg: ServerConfig, worker: Worker, metrics: Metrics):
    self.cfg, self.worker, self.metrics = cfg, worker, metrics
    self.model_id = pathlib.Path(cfg.model).name.removesuffix(".gguf")
    self.created = int(os.path.getmtime(cfg.model))
    self.stopping = False
    self.prompts = None  # chat.PromptWorker, made when the model is loaded (cli.serve)
    self.guard = ConnectionGuard(cfg.max_connections, cfg.header_timeout, cfg.keepalive_timeout)
    self._grammars = self._tool_format = None

  def ready(self):
    """The engine and tokenizer once the worker is ready; 503 before."""
    if self.stopping: raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
    if self.worker.state != "ready":
      raise APIError(503, f"the model is not ready yet ({self.worker.state})", "server_error", code="model_not_ready", headers={"Retry-After": "5"})
    return self.worker.engine, self.worker.tok

  def max_prompt(self, eng) -> int:
    """Prompt tokens a request may have: max_prompt_tokens, and never more than the context holds with one new token."""
    cap = self.cfg.max_prompt_tokens
    return min(cap, eng.max_context - 1) if cap is not None else eng.max_context - 1

  def too_long(self, eng, n: int, exact: bool = True) -> str:
    cap = self.cfg.max_prompt_tokens
    why = f"max_prompt_tokens = {cap}" if cap is not None and cap < eng.max_context - 1 else \
          f"the context holds {eng.max_context}: prompt plus at least one new token"
    return f"the prompt has {n}{'' if exact else ' or more'} tokens, over this server's limit of {self.max_prompt(eng)} ({why})"

  async def prompt_ids(self, eng, param: str, op: str, *args, **kw) -> list[int]:
    """Token ids from the prompt worker (op: "chat" renders messages and tokenizes them, "encode" tokenizes a raw
    prompt), in a thread: neither templates nor the tokenizer (which holds the GIL for ~0.6 s a MiB) run on the
    event loop, and the worker's bounds (time, memory, output) come back as 400s."""
    limit = self.max_prompt(eng)
    try: return await asyncio.to_thread(getattr(self.prompts, op), *args, max_tokens=limit, **kw)
    except TooLong as e: raise APIError(400, self.too_long(eng, e.tokens, False), param=param, code="context_length_exceeded") from None
    except OrinError as e: raise APIError(400, str(e), param=param, code="template_error" if op == "chat" else None) from None

  def grammars(self):
    """llguidance's vocabulary of the model (structured.Grammars): built while the model loads (build_grammars), else
    on first use."""
    if self._grammars is None:
      from orin_llm.structured import Grammars
      self._grammars = Grammars(self.worker.tok, self.worker.engine.cfg.vocab_size)
    return self._grammars

  def build_grammars(self, tok, eng):
    """Builds llguidance's vocabulary before READY (cli.serve calls it on the engine thread). Its constructor (Rust)
    holds the GIL from start to end, 0.4-0.7 s for LLaMA 3's 128k tokens on an x86 core: built at the first
    structured request, even in a thread, it stalled the event loop (/health waited up to 0.69 s; every stream
    waited too). A failure here is left for the requests that need the vocabulary to report."""
    from orin_llm.structured import Grammars
    t0 = time.monotonic()
    try:
      n_vocab = eng.cfg.vocab_size
      g = Grammars(tok, n_vocab)
      g.lltok()
    except Exception as e:  # noqa: BLE001 (llguidance missing or refusing the vocabulary: structured requests say so)
      logger.warning(f"structured output: llguidance's vocabulary was not built ({e}); requests that need it will try again")
      return
    self._grammars = g
    logger.info(f"structured output: llguidance's vocabulary of {n_vocab} tokens built in {time.monotonic() - t0:.1f} s")

  def tool_format(self):
    """The tool-call family of the model's chat template (structured.tool_format)."""
    if self._tool_format is None:
      from orin_llm.chat import ChatTemplate
      from orin_llm.structured import tool_format
      self._tool_format = tool_format(ChatTemplate.parts(self.worker.engine.file.metadata)[0], self.grammars())
    return self._tool_format

SERVER = web.AppKey("server", Server)

# ---------------------------------------------------------------------- connections
_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}

def _canned(status: int, message: str, code: str, extra: str = "") -> bytes:
  """A whole HTTP response written straight to a connection aiohttp never saw a request on (or never will)."""
  body = json.dumps(APIError(status, message, "server_error" if status >= 500 else "invalid_request_error", code=code).body()).encode()
  return (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
          f"Connection: close\r\n\r\n").encode() + body

class _Conn(asyncio.Protocol):
  """One connection, between the event loop and aiohttp's handler for it (inner). States: idle (between requests),
  header (a request's first bytes came, its headers did not yet), body (the handler waits for the body), busy."""
  def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
    self.guard, self.inner, self.transport, self.open = guard, inner, None, False
    self.state, self.since = "idle", time.monotonic()
  def set(self, state: str):
    self.state, self.since = state, time.monotonic()
  def connection_made(self, transport):
    self.transport = transport
    if not self.guard.admit(self):
      transport.write(self.guard.refusal)
      transport.close()
      return
    self.open = True
    self.inner.connection_made(transport)
  def data_received(self, data):
    if not self.open: return
    if self.state == "idle": self.set("header")
    self.inner.data_received(data)
  def eof_received(self): return self.inner.eof_received() if self.open else None
  def connection_lost(self, exc):
    self.guard.forget(self)
    if self.open: self.inner.connection_lost(exc)
  def pause_writing(self):
    if self.open: self.inner.pause_writing()
  def resume_writing(self):
    if self.open: self.inner.resume_writing()

class _Handler(RequestHandler):
  """aiohttp's handler of a connection, answering requests it cannot parse (a bad header, request line, chunk) with
  OpenAI's error object and no traceback in the log (aiohttp's own: text/plain and logger.exception, every time)."""
  def handle_error(self, request, status=500, exc=None, message=None):
    if status >= 500: return super().handle_error(request, status, exc, message)
    why = (str(exc) if exc is not None else message or "").strip().splitlines() or ["malformed request"]
    logger.debug("bad HTTP request from %s: %s", request.remote, why[0])
    if request.writer.output_size > 0: raise ConnectionError("a response was sent already")
    r = APIError(status, f"bad HTTP request: {why[0][:200]}", code="bad_request").response()
    r.force_close()
    return r
  def log_exception(self, *args, **kw):
    # a body left unread (a 401, say) is drained before the next request, and a bad one (chunks, Content-Encoding)
    # fails there: the client's error, one line at debug level; anything else keeps its traceback
    exc = kw.get("exc_info")
    if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
      logger.debug("bad HTTP request: %s", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
    else: super().log_exception(*args, **kw)

def handler_factory(server):
  """A new _Handler for aiohttp's web.Server, as its __call__ makes a RequestHandler (its own, where it has changed)."""
  try: return _Handler(server, loop=server._loop, **server._kwargs)
  except (AttributeError, TypeError): return server()

class ConnectionGuard:
  """What aiohttp does not bound (issue 23: half-sent requests stayed open for minutes, and ~1000 of them ran the
  process out of file descriptors, /health included): a request's headers must arrive within header_timeout
  (else 408 and close), a connection may idle keepalive_timeout between requests, and at most `limit` are open.
  A connection past the limit takes the place of the one that has waited longest for its headers or body, or
  else has idled longest; only when every one is busy with a request is it refused (503, Retry-After). So a crowd
  of slow clients cannot keep /health, or anyone, out."""
  def __init__(self, limit: int, header_timeout: float, keepalive_timeout: float):
    self.limit, self.header_timeout, self.keepalive_timeout = limit, header_timeout, keepalive_timeout
    self.conns: dict[object, _Conn] = {}
    self.counts = {"refused": 0, "evicted": 0, "timed_out": 0}
    self._logged, self._task = dict(self.counts), None
    self.refusal = _canned(503, f"too many connections (max_connections = {limit}), all busy; try again later", "too_many_connections", "Retry-After: 1\r\n")
    self.timeout = _canned(408, f"the request headers did not arrive within {header_timeout:g} s (header_timeout)", "request_timeout")

  def protocol(self, inner: asyncio.Protocol) -> _Conn: return _Conn(self, inner)
  def conn(self, request: web.Request) -> _Conn | None: return self.conns.get(request.transport)

  def admit(self, c: _Conn) -> bool:
    if len(self.conns) >= self.limit:
      victim = min((x for x in self.conns.values() if x.state != "busy"), key=lambda x: (x.state == "idle", x.since), default=None)
      if victim is None:
        self.counts["refused"] += 1
        return False
      self.counts["evicted"] += 1
      self._drop(victim, abort=victim.state != "idle")
    self.conns[c.transport] = c
    return True

  def _drop(self, c: _Conn, abort: bool = False, reply: bytes | None = None):
    self.conns.pop(c.transport, None)
    if reply is not None: c.transport.write(reply)
    if abort: c.transport.abort()
    else: c.transport.close()

  def forget(self, c: _Conn): self.conns.pop(c.transport, None)

  def sweep(self, now: float):
    for c in list(self.conns.values()):
      if c.state == "header" and now - c.since > self.header_timeout:
        self.counts["timed_out"] += 1
        self._drop(c, reply=self.timeout)
      elif c.state == "idle" and now - c.since > self.keepalive_timeout: self._drop(c)
    if self.counts != self._logged:  # one line a sweep at most, and only when something happened
      d = {k: v - self._logged[k] for k, v in self.counts.items() if v != self._logged[k]}
      logger.warning("connections: " + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in d.items()) +
                     f" ({len(self.conns)} open, max_connections = {self.limit})")
      self._logged = dict(self.counts)

  async def run(self):
    tick = max(0.05, min(1.0, self.header_timeout / 4, self.keepalive_timeout / 4))
    while True:
      await asyncio.sleep(tick)
      self.sweep(time.monotonic())

  def start(self): self._task = asyncio.get_running_loop().create_task(self.run())
  def stop(self):
    if self._task is not None: self._task.cancel()

@web.middleware
async def connection_state(request: web.Request, handler):
  c = request.app[SERVER].guard.conn(request)
  if c is None: return await handler(request)
  c.set("busy")
  try: return await handler(request)
  finally: c.set("idle")

# ---------------------------------------------------------------------- middleware
@web.middleware
async def errors_and_metrics(request: web.Request, handler):
  srv = request.app[SERVER]
  route = request.match_info.route.resource
  endpoint = route.canonical if route is not None else "other"  # unknown paths share one label
  status = 500
  try:
    resp = await handler(request)
    status = resp.status
    return resp
  except APIError as e:
    status = e.status
    r = e.response()
    if e.close and request.transport is not None:  # sent now and closed: aiohttp would wait (up to 10 s) for the rest of the body
      await r.prepare(request); await r.write_eof()
      request.transport.close()
    return r
  except web.HTTPException as e:  # aiohttp's own: 404, 405, 413 (body over client_max_size), ...
    status = e.status
    if e.status < 400: raise
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
    msg = f"request body over {MAX_BODY_BYTES} bytes" if e.status == 413 else f"{e.reason}: {request.method} {request.path}"
    return APIError(e.status, msg, code=code, headers={k: v for k, v in e.headers.items() if k == "Allow"}).response()
  except asyncio.CancelledError:
    status = 499  # the client went away (nginx's code for it); only counted
    raise
  except Exception:
    logger.exception("%s %s failed", request.method, request.path)
    return APIError(500, "internal server error", "server_error").response()
  finally: srv.metrics.requests.labels(endpoint, str(status)).inc()

@web.middleware
async def auth(request: web.Request, handler):
  key = request.app[SERVER].cfg.api_key
  if key and request.path.startswith("/v1/"):
    got = request.headers.get("Authorization", "")
    scheme, _, token = got.partition(" ")
    # aiohttp hands header bytes that are not UTF-8 over as surrogate escapes: compared as the bytes they were
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), key.encode()):
      raise APIError(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')", code="invalid_api_key",
                     headers={"WWW-Authenticate": "Bearer"})
  return await handler(request)

# ---------------------------------------------------------------------- request checks
MAX_DEPTH = 64  # nesting of arrays and objects in a body (JSON schemas of tools included); json.loads fails near 1000

def _check_values(body) -> str | None:
  """What is wrong with the body's values, walked without recursion: nesting past MAX_DEPTH, or a string with a lone
  UTF-16 surrogate (JSON may escape half a pair, \\ud800: no text, and the tokenizer fails on it)."""
  todo = [(body, 1)]
  while todo:
    x, depth = todo.pop()
    if depth > MAX_DEPTH: return f"the body is nested over {MAX_DEPTH} deep"
    if isinstance(x, str):
      try: x.encode("utf-8")
      except UnicodeEncodeError as e: return f"the body holds a lone UTF-16 surrogate ({x[e.start]!r}): strings must be valid Unicode"
    elif isinstance(x, dict): todo += [(k, depth) for k in x] + [(v, depth + 1) for v in x.values()]
    elif isinstance(x, list): todo += [(v, depth + 1) for v in x]
  return None

async def _body(request: web.Request) -> dict:
  srv = request.app[SERVER]
  if request.content_length is not None and request.content_length > MAX_BODY_BYTES: raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length)
  c = srv.guard.conn(request)
  if c is not None: c.set("body")  # a slow body: the guard may drop this connection for a new one
  try:
    async with asyncio.timeout(srv.cfg.body_timeout): raw = await request.read()
  except TimeoutError:
    raise APIError(408, f"the request body did not arrive within {srv.cfg.body_timeout:g} s (body_timeout)", code="request_timeout", close=True) from None
  except RequestPayloadError as e:  # bad chunked framing, a Content-Encoding that does not decode
    why = (str(e.__cause__ or e).strip().splitlines() or ["unreadable"])[0]
    raise APIError(400, f"the request body cannot be read: {why[:200]}", close=True) from None
  finally:
    if c is not None: c.set("busy")
  try: body = json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e: raise APIError(400, f"the body is not valid JSON: {e}") from None
  except RecursionError: raise APIError(400, f"the body is nested over {MAX_DEPTH} deep") from None
  if not isinstance(body, dict): raise APIError(400, "the body must be a JSON object")
  # only a body with more brackets than MAX_DEPTH can nest deeper, only one with a \\udXXX escape hold a surrogate
  if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH or _SURROGATE_ESCAPE.search(raw):
    if (why := await asyncio.to_thread(_check_values, body)) is not None: raise APIError(400, why)
  return body

_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", dict: "an object", list: "an array"}
def _field(body: dict, key: str, typ, default=None, ok=None, wants: str = ""):
  v = body.get(key)
  if v is None: return default
  good = isinstance(v, (int, float)) and not isinstance(v, bool) if typ is float else \
         isinstance(v, int) and not isinstance(v, bool) if typ is int else isinstance(v, typ)
  if not good: raise APIError(400, f"{key} must be {wants or _TYPES[typ]}, not {json.dumps(v)[:60]}", param=key)
  if ok is not None and not ok(v): raise APIError(400, f"{key} must be {wants}, not {json.dumps(v)[:60]}", param=key)
  return v

def _check_model(srv: Server, body: dict):
  m = _field(body, "model", str)
  if m is not None and m not in (srv.model_id, srv.model_id + ".gguf"):
    raise APIError(404, f"the model {m!r} does not exist (this server has {srv.model_id!r})", param="model", code="model_not_found")

def _generation(srv: Server, eng, body: dict, prompt: list[int], param: str, chat: bool) -> dict:
  """The fields that steer generation, checked; the prompt checked against the context and max_prompt_tokens."""
  if len(prompt) > srv.max_prompt(eng): raise APIError(400, srv.too_long(eng, len(prompt)), param=param, code="context_length_exceeded")
  try: eng.check_prompt(prompt)
  except OrinError as e: raise APIError(400, str(e), param=param, code="context_length_exceeded") from None
  lim = eng.max_context
  key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
  max_new = _field(body, key, int, None, lambda v: 1 <= v <= lim, f"an integer in 1..{lim}")
  if max_new is None: max_new = min(srv.cfg.max_tokens_default, lim - len(prompt))
  _field(body, "n", int, 1, lambda v: v == 1, "1 (one choice per request)")
  temperature = _field(body, "temperature", float, 1.0, lambda v: 0 <= v <= 2, "a number in 0..2")
  top_p = _field(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
  # bounded: the engine takes them as float32 (float(10**400) is an OverflowError)
  top_k = _field(body, "top_k", int, 0, lambda v: 0 <= v < 1 << 31, "an integer in 0..2147483647")
  seed = _field(body, "seed", int, None, lambda v: -(1 << 63) <= v < 1 << 64, "a 64-bit integer")
  if seed is None: seed = int.from_bytes(os.urandom(3), "little")
  stop = body.get("stop")
  if stop is None: stop = []
  elif isinstance(stop, str): stop = [stop]
  if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
    raise APIError(400, f"stop must be a non-empty string or an array of at most {MAX_STOP} of them", param="stop")
  stream = _field(body, "stream", bool, False)
  opts = _field(body, "stream_options", dict, {})
  usage = _field(opts, "include_usage", bool, False) if opts else False
  if opts and not stream: raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
  speculative = _field(body, "speculative", bool, True)  # an extension: false keeps this request off speculative decoding
  return {"max_new": max_new, "sampling": Sampling(temperature, top_k, top_p, seed), "stop": stop, "stream": stream, "usage": usage,
          "speculative": speculative}

def _messages(body: dict) -> list[dict]:
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs: raise APIError(400, "messages must be a non-empty array of messages", param="messages")
  out = []
  for i, m in enumerate(msgs):
    where = f"messages[{i}]"
    if not isinstance(m, dict): raise APIError(400, f"{where} must be an object", param=where)
    if not isinstance(m.get("role"), str) or not m["role"]: raise APIError(400, f"{where}.role must be a non-empty string", param=f"{where}.role")
    c = m.get("content")
    if isinstance(c, list):  # content parts: only text can reach a text model
      texts = []
      for p in c:
        if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
          raise APIError(400, f"{where}.content: only parts of type 'text' are supported", param=f"{where}.content")
        texts.append(p["text"])
      c = "".join(texts)
    elif c is None: c = ""
    elif not isinstance(c, str): raise APIError(400, f"{where}.content must be a string or an array of text parts", param=f"{where}.content")
    out.append({**m, "content": c})
  return out

# ---------------------------------------------------------------------- structured output (docs/SERVER.md: JSON output, tool calls)
MAX_TOOLS = 128  # OpenAI's limit
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

def _response_format(body: dict) -> tuple | None:
  """(grammar, param, schema, strict) for response_format, None for text. json_object: any object; json_schema: its
  schema, with objects closed under strict (structured.close_objects). llama.cpp's {"type": "json_object",
  "schema": {...}} is taken too."""
  from orin_llm.structured import GrammarError, json_grammar
  rf = _field(body, "response_format", dict)
  if rf is None or rf.get("type") == "text": return None
  typ = rf.get("type")
  if typ == "json_object":
    schema, strict, where = rf.get("schema", {"type": "object"}), False, "response_format.schema"
    if not isinstance(schema, dict): raise APIError(400, f"{where} must be a JSON schema (an object)", param=where)
  elif typ == "json_schema":
    js = rf.get("json_schema")
    if not isinstance(js, dict): raise APIError(400, "response_format.json_schema must be an object with a schema", param="response_format.json_schema")
    schema, where = js.get("schema", {}), "response_format.json_schema.schema"
    if not isinstance(schema, (dict, bool)): raise APIError(400, f"{where} must be a JSON schema (an object)", param=where)
    strict = js.get("strict") is True
  else: raise APIError(400, f"response_format.type must be 'text', 'json_object' or 'json_schema', not {json.dumps(typ)[:40]}", param="response_format.type")
  try: return json_grammar(schema, strict), where, schema, strict
  except GrammarError as e: raise APIError(400, f"{where}: {e}", param=where) from None

def _tools(body: dict) -> tuple[list[dict], str, bool]:
  """(tools, tool_choice, parallel_tool_calls), checked. tool_choice: 'none', 'auto', 'required' or a tool's name."""
  tools = body.get("tools")
  if tools is None: tools = []
  if not isinstance(tools, list) or len(tools) > MAX_TOOLS: raise APIError(400, f"tools must be an array of at most {MAX_TOOLS} tools", param="tools")
  names = set()
  for i, t in enumerate(tools):
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
      raise APIError(400, f'{where} must be {{"type": "function", "function": {{...}}}} (only function tools are supported)', param=where)
    f = t["function"]
    if not isinstance(f.get("name"), str) or not _TOOL_NAME.match(f["name"]):
      raise APIError(400, f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.'", param=f"{where}.function.name")
    if f["name"] in names: raise APIError(400, f"{where}.function.name: two tools are named {f['name']!r}", param=f"{where}.function.name")
    names.add(f["name"])
    if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
      raise APIError(400, f"{where}.function.parameters must be a JSON schema (an object)", param=f"{where}.function.parameters")
  choice = body.get("tool_choice")
  if choice is None: choice = "auto" if tools else "none"
  if isinstance(choice, dict):
    fn = choice.get("function")
    if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
      raise APIError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}', param="tool_choice")
    if fn["name"] not in names: raise APIError(400, f"tool_choice names the function {fn['name']!r}, which is not in tools", param="tool_choice")
    choice = fn["name"]
  elif choice not in ("none", "auto", "required"):
    raise APIError(400, f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": {{"name": ...}}}}, not {json.dumps(choice)[:40]}', param="tool_choice")
  elif choice == "required" and not tools: raise APIError(400, 'tool_choice "required" needs tools', param="tool_choice")
  parallel = _field(body, "parallel_tool_calls", bool, True)
  return tools, choice, parallel

def _tool_history(msgs: list[dict]) -> list[dict]:
  """Messages with assistant tool_calls checked (arguments: a JSON object as a string, as OpenAI sends them)
  and empty ones dropped: templates test `'tool_calls' in message`."""
  out = []
  for i, m in enumerate(msgs):
    calls = m.get("tool_calls")
    if not calls: out.append({k: v for k, v in m.items() if k != "tool_calls"}); continue
    where = f"messages[{i}].tool_calls"
    if m["role"] != "assistant" or not isinstance(calls, list): raise APIError(400, f"{where}: only assistant messages carry an array of tool calls", param=where)
    for j, c in enumerate(calls):
      f = c.get("function") if isinstance(c, dict) else None
      if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments", "{}"), (str, dict)):
        raise APIError(400, f'{where}[{j}] must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', param=f"{where}[{j}]")
      if isinstance(f.get("arguments"), str):
        try: json.loads(f["arguments"])
        except ValueError: raise APIError(400, f"{where}[{j}].function.arguments is not JSON", param=f"{where}[{j}].function.arguments") from None
    out.append(m)
  return out

def _structured_chat(srv: Server, body: dict, msgs: list[dict]) -> dict:
  """What tools and response_format make of a chat request: the messages and variables for the template,
  the grammar (grammar, param, schema) that constrains the answer or None, the ToolFormat to parse it or None."""
  from orin_llm.structured import Generic, json_lark
  tools, choice, parallel = _tools(body)
  rf = _response_format(body)
  msgs = _tool_history(msgs)
  if not tools or choice == "none":  # the model is not told of tools it may not call
    return {"messages": msgs, "template": {"enable_thinking": False} if rf else {}, "grammar": rf, "tools": None}
  fmt = srv.tool_format()
  if isinstance(fmt, Generic): msgs, tvars = fmt.messages(msgs, tools), {}
  else: tvars = {"tools": tools}
  grammar = None
  if choice != "auto" or rf is not None:
    called = tools if choice in ("auto", "required") else [t for t in tools if t["function"]["name"] == choice]
    lark, where = fmt.grammar(called, parallel), {"tools": tools}
    if rf is not None and choice == "auto":  # an answer in the schema, or tool calls
      lark = lark.replace("start:", "calls:", 1) + f"start: calls | answer\nanswer: {json_lark(rf[2], rf[3])}\n"
      where["response_format"] = rf[2]  # an error's JSON pointer may point there
    grammar = (lark, "tools", where)
    # a template that may open a thinking block (Qwen3) is told not to: the grammar starts the answer at once
    tvars["enable_thinking"] = False
  return {"messages": msgs, "template": tvars, "grammar": grammar, "tools": fmt}

async def _constraint(srv: Server, grammar: str, param: str, schema=None):
  """A structured.Constraint, built off the event loop (validating a grammar takes milliseconds; the vocabulary, if
  build_grammars could not build it at start, is built there too)."""
  from orin_llm.structured import GrammarError
  try: return await asyncio.get_running_loop().run_in_executor(None, lambda: srv.grammars().constraint(grammar, param, schema))
  except GrammarError as e: raise APIError(400, str(e), param=param) from None

def _tool_choice(text: str, finish: str, fmt) -> dict:
  """The non-streamed choice of a chat with tools: the calls parsed from text, or text as content."""
  from orin_llm.structured import new_call_id
  parsed = fmt.parse(text)
  if not parsed or not parsed[1]: return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
  content, calls = parsed
  return {"index": 0, "message": {"role": "assistant", "content": content or None,
                                  "tool_calls": [{"id": new_call_id(), "type": "function", "function": c} for c in calls]},
          "logprobs": None, "finish_reason": "tool_calls"}

# ---------------------------------------------------------------------- generation
_MARK = "\0text\0"  # a text no token gives: where a chunk's text goes in its template

def _template(obj: dict):
  """f(text) -> the SSE event of obj with _MARK replaced by text: json.dumps(obj)'s bytes, with the text's JSON string
  encoded alone (the rest of the chunk is the same for every token of a stream)."""
  mark = json.dumps(_MARK)
  parts = json.dumps(obj, ensure_ascii=False).split(mark)
  if len(parts) != 2: raise ValueError("a stream's chunk holds the text's marker other than once")  # before any header is sent
  before, after = parts
  before, after = b"data: " + before.encode(), after.encode() + b"\n\n"
  return lambda text: before + json.dumps(text, ensure_ascii=False).encode() + after

async def _run(request: web.Request, srv: Server, prompt: list[int], g: dict, chat: bool, received: float, reading: Reading,
               tools=None) -> web.StreamResponse:
  """tools: the structured.ToolFormat whose calls the answer may hold (chat with tools), None for plain text.
  received: when the handler began (time.monotonic), for the answer's timings; reading: its Reading, done once the job
  is queued (or refused)."""
  job = Job(prompt, g["max_new"], g["sampling"], g["stop"], asyncio.get_running_loop(), speculative=g["speculative"],
            constraint=g.get("constraint"), received=received)
  try: srv.worker.submit(job)
  except QueueFull as e:
    raise APIError(429, f"the request queue is full ({srv.worker.queue_size} waiting); try again later", "rate_limit_error",
                   code="queue_full", headers={"Retry-After": str(e.retry_after)}) from None
  finally: reading.done()
  rid, created = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time())
  obj = "chat.completion" if chat else "text_completion"
  def choice(text: str | None, finish: str | None, delta: bool) -> dict:
    if chat: c = {"index": 0, ("delta" if delta else "message"): ({"content": text} if text is not None else {}) if delta else {"role": "assistant", "content": text}}
    else: c = {"index": 0, "text": text or ""}
    return {**c, "logprobs": None, "finish_reason": finish}
  try:
    if not g["stream"]:
      parts = []
      while True:
        ev = await job.events.get()
        if ev[0] == "text": parts.append(ev[1])
        elif ev[0] == "error": raise APIError(500, ev[1], "server_error")
        elif ev[0] == "end":
          c = choice("".join(parts), ev[1], False) if tools is None else _tool_choice("".join(parts), ev[1], tools)
          return web.json_response({"id": rid, "object": obj, "created": created, "model": srv.model_id, "system_fingerprint": None,
                                    "choices": [c], "usage": ev[2], "timings": ev[3]})
    chunk = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created, "model": srv.model_id, "system_fingerprint": None}
    # the events that have come are written together, one write a decode round rather than a token (worker.Job.held);
    # a text chunk is its template's bytes around the text's JSON string (the same bytes json.dumps gives the chunk)
    out, text_chunk = [], _template({**chunk, "choices": [choice(_MARK, None, True)]})
    def put(data): out.append(b"data: " + (data if isinstance(data, bytes) else json.dumps(data, ensure_ascii=False).encode()) + b"\n\n")
    async def write():
      if out:
        data = b"".join(out); out.clear()
        await resp.write(data)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    try:
      if chat:  # at once, as before the job takes a slot
        put({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
        await write()
      calls = None
      if tools is not None:
        from orin_llm.structured import ToolStream
        calls = ToolStream(tools)
      def deltas(ds):
        for d in ds: put({**chunk, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]})
      ended = False
      while not ended:
        evs = [await job.events.get()]
        while not job.events.empty(): evs.append(job.events.get_nowait())
        try:
          for ev in evs:
            if ev[0] == "text":
              if calls is not None: deltas(calls.push(ev[1]))
              else: out.append(text_chunk(ev[1]))
            elif ev[0] == "error":
              put({"error": {"message": ev[1], "type": "server_error", "param": None, "code": None}}); ended = True; break
            elif ev[0] == "end":
              finish = ev[1]
              if calls is not None:
                deltas(calls.finish())
                if calls.calls: finish = "tool_calls"
              put({**chunk, "choices": [choice(None if chat else "", finish, True)], "timings": ev[3]})  # as llama-server's last chunk
              if g["usage"]: put({**chunk, "choices": [], "usage": ev[2]})
              ended = True; break
          if ended: put(b"[DONE]")
        finally: await write()  # what was formatted goes out, even when a later event's formatting failed
      await resp.write_eof()
    except ConnectionError: pass  # the client left mid-stream; finally frees the engine
    return resp
  finally: job.cancel()  # no-op when the job is done; otherwise stops it (or keeps it from starting)

# ---------------------------------------------------------------------- routes
async def chat_completions(request: web.Request):
  received, srv = time.monotonic(), request.app[SERVER]
  eng, tok = srv.ready()
  with Reading(srv.worker) as reading: return await _chat_completions(request, srv, eng, received, reading)

async def _chat_completions(request: web.Request, srv: Server, eng, received: float, reading: Reading):
  body = await _body(request)
  _check_model(srv, body)
  msgs = _messages(body)
  st = _structured_chat(srv, body, msgs)
  # message content tokenized as text (chat.ChatTemplate.encode); tools and enable_thinking go to the template
  ids = await srv.prompt_ids(eng, "messages", "chat", st["messages"], **st["template"])
  g = _generation(srv, eng, body, ids, "messages", True)
  if st["grammar"] is not None: g["constraint"] = await _constraint(srv, *st["grammar"][:3])
  return await _run(request, srv, ids, g, True, received, reading, tools=st["tools"])

async def completions(request: web.Request):
  received, srv = time.monotonic(), request.app[SERVER]
  eng, tok = srv.ready()
  with Reading(srv.worker) as reading: return await _completions(request, srv, eng, tok, received, reading)

async def _completions(request: web.Request, srv: Server, eng, tok, received: float, reading: Reading):
  body = await _body(request)
  _check_model(srv, body)
  p = body.get("prompt")
  if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)): p = p[0]  # a batch of one
  if isinstance(p, str): ids = await srv.prompt_ids(eng, "prompt", "encode", p)
  elif isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
    if not all(0 <= i < tok.vocab_size for i in p): raise APIError(400, f"prompt token ids must be in 0..{tok.vocab_size - 1}", param="prompt")
    ids = p
  else: raise APIError(400, "prompt must be a string or an array of token ids (one prompt per request)", param="prompt")
  for k in ("echo", "logprobs", "suffix"):
    if body.get(k) not in (None, False, 0): raise APIError(400, f"{k} is not supported", param=k)
  if body.get("tools") or body.get("tool_choice") is not None:
    raise APIError(400, "tools are only supported on /v1/chat/completions", param="tools" if body.get("tools") else "tool_choice")
  g = _generation(srv, eng, body, ids, "prompt", False)
  if (rf := _response_format(body)) is not None: g["constraint"] = await _constraint(srv, *rf[:3])
  return await _run(request, srv, ids, g, False, received, reading)

async def models(request: web.Request):
  srv = request.app[SERVER]
  return web.json_response({"object": "list", "data": [{"id": srv.model_id, "object": "model", "created": srv.created, "owned_by": "orin-llm"}]})

async def model(request: web.Request):
  srv = request.app[SERVER]
  if request.match_info["id"] not in (srv.model_id, srv.model_id + ".gguf"):
    raise APIError(404, f"the model {request.match_info['id']!r} does not exist", param="model", code="model_not_found")
  return web.json_response({"id": srv.model_id, "object": "model", "created": srv.created, "owned_by": "orin-llm"})

async def health(request: web.Request):
  srv = request.app[SERVER]
  w = srv.worker
  state = "stopping" if srv.stopping else w.state
  body = {"status": state, "model": srv.model_id}
  if w.failure is not None: body["error"] = str(w.failure)
  # requests_reading: generation requests begun and not yet queued (worker.Reading)
  if state == "ready": body.update(queue_depth=w.depth(), requests_reading=w.reading, context_length=w.engine.max_context)
  if (k := w.kernel_counts()) is not None:  # misses_after_ready > 0: a request compiled (prewarm missed a step)
    body["kernel_cache"] = k | {"misses_after_ready": k["misses"] - w.ready_counts["misses"] if w.ready_counts else None,
                                # the captured steps' file (step_cache.py): loaded at start, or written by its warm-up
                                "steps_file": str(f) if (f := getattr(w.engine, "steps_file", None)) else None}
  return web.json_response(body, status=200 if state == "ready" else 503)

async def metrics(request: web.Request):
  m = request.app[SERVER].metrics
  m.queue_depth.set(request.app[SERVER].worker.depth())
  return web.Response(body=m.render(), headers={"Content-Type": m.content_type})

def make_app(srv: Server) -> web.Application:
  app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[connection_state, errors_and_metrics, auth])
  app[SERVER] = srv
  app.router.add_post("/v1/chat/completions", chat_completions)
  app.router.add_post("/v1/completions", completions)
  app.router.add_get("/v1/models", models)
  app.router.add_get("/v1/models/{id}", model)
  app.router.add_get("/health", health)
  app.router.add_get("/metrics", metrics)
  return app
