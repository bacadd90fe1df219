"""The HTTP API (aiohttp): OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus
/health and /metrics. Requests are checked here, on the event loop; generation runs on the
engine thread (worker.py). Anything a client sends that is wrong gets OpenAI's error object
({"error": {"message", "type", "param", "code"}}) with a 4xx status, never a 500."""
from __future__ import annotations
import asyncio, hmac, json, logging, os, pathlib, re, time, uuid
from aiohttp import web
from orin_llm.errors import OrinError
from orin_llm.sampling import Sampling
from orin_llm.server.config import ServerConfig
from orin_llm.server.metrics import Metrics
from orin_llm.server.worker import Job, QueueFull, Worker

logger = logging.getLogger("orin_llm.server")
MAX_BODY_BYTES = 1 << 20  # far above any prompt that fits a Jetson's context, far below what could hurt
MAX_STOP = 16

class APIError(Exception):
  def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code, self.headers = status, message, type, param, code, headers
  def response(self) -> web.Response:
    return web.json_response({"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}},
                             status=self.status, headers=self.headers)

class Server:
  """What the handlers share: configuration, the engine thread, metrics, the model's name and chat template."""
  def __init__(self, cfg: ServerConfig, worker: Worker, metrics: Metrics):
    self.cfg, self.worker, self.metrics = cfg, worker, metrics
    self.model_id = pathlib.Path(cfg.model).name.removesuffix(".gguf")
    self.created = int(os.path.getmtime(cfg.model))
    self.stopping = False
    self._template = None
    self._grammars = self._tool_format = None

  def ready(self):
    """The engine and tokenizer once the worker is ready; 503 before."""
    if self.stopping: raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
    if self.worker.state != "ready":
      raise APIError(503, f"the model is not ready yet ({self.worker.state})", "server_error", code="model_not_ready", headers={"Retry-After": "5"})
    return self.worker.engine, self.worker.tok

  def template(self):
    if self._template is None:
      from orin_llm.chat import ChatTemplate
      self._template = ChatTemplate.from_metadata(self.worker.engine.file.metadata)
    return self._template

  def grammars(self):
    """llguidance's vocabulary of the model (structured.Grammars), built on first use."""
    if self._grammars is None:
      from orin_llm.structured import Grammars
      self._grammars = Grammars(self.worker.tok, self.worker.engine.cfg.vocab_size)
    return self._grammars

  def tool_format(self):
    """The tool-call family of the model's chat template (structured.tool_format)."""
    if self._tool_format is None:
      from orin_llm.structured import tool_format
      self._tool_format = tool_format(self.template().source, self.grammars())
    return self._tool_format

SERVER = web.AppKey("server", Server)

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
    return e.response()
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
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
      raise APIError(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')", code="invalid_api_key",
                     headers={"WWW-Authenticate": "Bearer"})
  return await handler(request)

# ---------------------------------------------------------------------- request checks
async def _body(request: web.Request) -> dict:
  if request.content_length is not None and request.content_length > MAX_BODY_BYTES: raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length)
  raw = await request.read()
  try: body = json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e: raise APIError(400, f"the body is not valid JSON: {e}") from None
  if not isinstance(body, dict): raise APIError(400, "the body must be a JSON object")
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
  """The fields that steer generation, checked; the prompt checked against the context."""
  try: eng.check_prompt(prompt)
  except OrinError as e: raise APIError(400, str(e), param=param, code="context_length_exceeded") from None
  lim = eng.max_context
  key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
  max_new = _field(body, key, int, None, lambda v: 1 <= v <= lim, f"an integer in 1..{lim}")
  if max_new is None: max_new = min(srv.cfg.max_tokens_default, lim - len(prompt))
  _field(body, "n", int, 1, lambda v: v == 1, "1 (one choice per request)")
  temperature = _field(body, "temperature", float, 1.0, lambda v: 0 <= v <= 2, "a number in 0..2")
  top_p = _field(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
  top_k = _field(body, "top_k", int, 0, lambda v: v >= 0, "an integer >= 0")
  seed = _field(body, "seed", int, None)
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
  """A structured.Constraint, built off the event loop (the first builds llguidance's vocabulary, ~1 s)."""
  from orin_llm.structured import GrammarError
  try: return await asyncio.get_running_loop().run_in_executor(None, srv.grammars().constraint, grammar, param, schema)
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
async def _run(request: web.Request, srv: Server, prompt: list[int], g: dict, chat: bool, tools=None) -> web.StreamResponse:
  """tools: the structured.ToolFormat whose calls the answer may hold (chat with tools), None for plain text."""
  job = Job(prompt, g["max_new"], g["sampling"], g["stop"], asyncio.get_running_loop(), speculative=g["speculative"],
            constraint=g.get("constraint"))
  try: srv.worker.submit(job)
  except QueueFull as e:
    raise APIError(429, f"the request queue is full ({srv.worker.queue_size} waiting); try again later", "rate_limit_error",
                   code="queue_full", headers={"Retry-After": str(e.retry_after)}) from None
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
                                    "choices": [c], "usage": ev[2]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    chunk = {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created, "model": srv.model_id, "system_fingerprint": None}
    async def send(data):
      await resp.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data, ensure_ascii=False).encode()) + b"\n\n")
    try:
      if chat: await send({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
      calls = None
      if tools is not None:
        from orin_llm.structured import ToolStream
        calls = ToolStream(tools)
      async def deltas(ds):
        for d in ds: await send({**chunk, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]})
      while True:
        ev = await job.events.get()
        if ev[0] == "text":
          if calls is not None: await deltas(calls.push(ev[1]))
          else: await send({**chunk, "choices": [choice(ev[1], None, True)]})
        elif ev[0] == "error":
          await send({"error": {"message": ev[1], "type": "server_error", "param": None, "code": None}}); break
        elif ev[0] == "end":
          finish = ev[1]
          if calls is not None:
            await deltas(calls.finish())
            if calls.calls: finish = "tool_calls"
          await send({**chunk, "choices": [choice(None if chat else "", finish, True)]})
          if g["usage"]: await send({**chunk, "choices": [], "usage": ev[2]})
          break
      await send(b"[DONE]")
      await resp.write_eof()
    except ConnectionError: pass  # the client left mid-stream; finally frees the engine
    return resp
  finally: job.cancel()  # no-op when the job is done; otherwise stops it (or keeps it from starting)

# ---------------------------------------------------------------------- routes
async def chat_completions(request: web.Request):
  srv = request.app[SERVER]
  eng, tok = srv.ready()
  body = await _body(request)
  _check_model(srv, body)
  msgs = _messages(body)
  st = _structured_chat(srv, body, msgs)
  try: text = srv.template().render(st["messages"], **st["template"])
  except OrinError as e: raise APIError(400, str(e), param="messages") from None
  bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else None
  ids = tok.encode(text, bos=False if bos and text.startswith(bos) else None)  # the template wrote BOS itself
  g = _generation(srv, eng, body, ids, "messages", True)
  if st["grammar"] is not None: g["constraint"] = await _constraint(srv, *st["grammar"][:3])
  return await _run(request, srv, ids, g, True, tools=st["tools"])

async def completions(request: web.Request):
  srv = request.app[SERVER]
  eng, tok = srv.ready()
  body = await _body(request)
  _check_model(srv, body)
  p = body.get("prompt")
  if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)): p = p[0]  # a batch of one
  if isinstance(p, str): ids = tok.encode(p)
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
  return await _run(request, srv, ids, g, False)

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
  if state == "ready": body.update(queue_depth=w.depth(), context_length=w.engine.max_context)
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
  app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[errors_and_metrics, auth])
  app[SERVER] = srv
  app.router.add_post("/v1/chat/completions", chat_completions)
  app.router.add_post("/v1/completions", completions)
  app.router.add_get("/v1/models", models)
  app.router.add_get("/v1/models/{id}", model)
  app.router.add_get("/health", health)
  app.router.add_get("/metrics", metrics)
  return app
