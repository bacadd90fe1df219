"""Fuzzing, bounded in time (issue 23): random mutations of real GGUF headers must give a one-line OrinError (or load),
and random requests against a running server a 2xx or a 4xx JSON error, never a traceback in its log, with /health
answering after every case. Each run draws fresh cases (the seed is printed: ORIN_TEST_SEED=... replays it); the
numbers of cases run are printed at the end of the run. FUZZ_SECONDS scales the time given to each fuzzer."""
import json, os, pathlib, resource, socket, struct, time, traceback, urllib.request
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.chat import ChatTemplate
from orin_llm.config import config_from_gguf
from orin_llm.errors import OrinError
from orin_llm.gguf_file import GGUFFile
from orin_llm.synth import write_model, preset
from orin_llm.tokenizer import Tokenizer
from conftest import FUZZ_COUNTS, LLAMA_VOCAB
from gguf_layout import walk
from vocab_files import smollm_path

SECONDS = float(os.environ.get("FUZZ_SECONDS", "1"))  # CI: 8 s for each model file, 15 s of requests

# ------------------------------------------------------------------ GGUF headers
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 16, 31, 32, 33, 63, 64, 255, 256, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               1 << 32, 1 << 40, (1 << 62) - 1, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
_BITS = {"<B": 8, "<b": 8, "<H": 16, "<h": 16, "<I": 32, "<i": 32, "<Q": 64, "<q": 64, "<?": 8}

def mutate(rng, data: bytes, fields, end: int) -> tuple[bytearray, str, str]:
  """(mutated copy, what was done, the field's name) of a header: a number set to an edge value, bytes of a string
  or array scrambled, bytes flipped, inserted or deleted, or the header cut short."""
  buf = bytearray(data)
  kind = rng.choice(["number", "number", "number", "number", "bytes", "flip", "cut", "insert", "delete"])
  if kind == "number":
    # half the time a field outside the vocabulary's arrays: counts, types, the model's numbers, tensor descriptions
    pool = [f for f in fields if f.fmt and (rng.random() < 0.5 or "[" not in f.name)]
    f = pool[rng.integers(len(pool))]
    old = struct.unpack_from(f.fmt, buf, f.pos)[0]
    if f.fmt in ("<f", "<d"): v = float(rng.choice([0.0, -1.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan"), old * 2, -old]))
    else:
      bits = _BITS[f.fmt]
      v = int(rng.choice(INTERESTING + [int(old) + 1, int(old) - 1, int(old) * 2, int(old) ^ (1 << int(rng.integers(bits))), int(rng.integers(1 << 62))]))
      v &= (1 << bits) - 1
      if f.fmt in ("<b", "<h", "<i", "<q") and v >= 1 << (bits - 1): v -= 1 << bits
      if f.fmt == "<?": v = v & 0xFF
    struct.pack_into(f.fmt if f.fmt != "<?" else "<B", buf, f.pos, v)
    return buf, f"{f.kind} of {f.name} = {v!r}", f.name
  if kind == "bytes":
    regions = [f for f in fields if f.fmt == "" and f.size]
    f = regions[rng.integers(len(regions))]
    for _ in range(int(rng.integers(1, 5))): buf[f.pos + int(rng.integers(f.size))] = int(rng.choice([0x00, 0x80, 0xC0, 0xFF, 0x7B, 0x25, rng.integers(256)]))
    return buf, f"bytes of {f.name} scrambled", f.name
  at = int(rng.integers(8, end))
  if kind == "flip":
    for _ in range(int(rng.integers(1, 5))): buf[int(rng.integers(8, end))] ^= 1 << int(rng.integers(8))
    return buf, f"bits flipped from byte {at}", ""
  if kind == "cut": return buf[:at], f"cut at byte {at}", ""
  if kind == "insert":
    n = int(rng.integers(1, 9))
    return buf[:at] + bytearray(rng.integers(0, 256, n, dtype=np.uint8).tobytes()) + buf[at:], f"{n} bytes inserted at {at}", ""
  n = int(rng.integers(1, 9))
  return buf[:at] + buf[at + n:], f"{n} bytes deleted at {at}", ""

def header_fuzz(rng, path: pathlib.Path, seconds: float, tmp: pathlib.Path, always_tokenize: bool) -> tuple[int, int]:
  """Mutated copies of path's header over a sparse copy of its tensor data; (cases, one-line errors)."""
  size = path.stat().st_size
  with open(path, "rb") as fh: head = fh.read(min(size, 16 << 20))
  fields, end = walk(head)
  data_start = GGUFFile(path).data_start
  base, out = head[:data_start], tmp / f"fuzz-{path.name}"
  cases = errors = 0
  rss0, t_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic() + seconds
  while time.monotonic() < t_end:
    buf, what, name = mutate(rng, base, fields, end)
    with open(out, "wb") as fh:
      fh.write(buf)
      fh.truncate(len(buf) + size - data_start)  # the tensor data: a hole, read by nothing here
    cases += 1
    t0, f = time.monotonic(), None
    try:
      f = GGUFFile(out)
      config_from_gguf(f)
      if always_tokenize or name.startswith("tokenizer.") or not name: Tokenizer.from_metadata(f.metadata)
      if name == "tokenizer.chat_template" or not name: ChatTemplate.from_metadata(f.metadata)
    except OrinError as e:
      errors += 1
      assert "\n" not in str(e), f"case {cases} ({what}): a multi-line error: {e}"
    except Exception as e:
      pytest.fail(f"case {cases} of {path.name} ({what}): {type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
      if f is not None: f.close()
    assert time.monotonic() - t0 < 5, f"case {cases} ({what}) took {time.monotonic() - t0:.1f} s"
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 1 << 20, "the process grew by a GB"  # KiB
  return cases, errors

@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
  return write_model(tmp_path_factory.mktemp("fuzz") / "small.gguf", preset("tiny-qwen3", n_layers=2), QT.Q4_K, LLAMA_VOCAB, vocab_size=1024,
                     types={"token_embd.weight": QT.Q8_0})

def test_fuzz_gguf_headers(rng, small_model, tmp_path):
  counts = {"synthetic qwen3 (vocab 1024)": header_fuzz(rng, small_model, 8 * SECONDS, tmp_path, always_tokenize=True)}
  if (smol := smollm_path()) is not None and smol.exists():
    counts["SmolLM2-135M-Instruct"] = header_fuzz(rng, smol, 8 * SECONDS, tmp_path, always_tokenize=False)
  FUZZ_COUNTS["GGUF headers"] = ", ".join(f"{n}: {c} mutations ({e} one-line errors, {c - e} loaded)" for n, (c, e) in counts.items())
  assert all(c >= 20 for c, _ in counts.values()), counts

# ------------------------------------------------------------------ requests against a running server
CONTROL = ["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>", "<|im_end|>", "<|", "|>"]
NUMBERS = [0, 1, 2, -1, 2, 1.5, -0.0, 1e308, -1e308, 2 ** 31, 2 ** 63, 2 ** 64, 10 ** 30, True, False, None]

class Gen:
  """Random JSON for the API: mostly well-formed requests with one field or another made wrong, sometimes garbage."""
  def __init__(self, rng, key): self.rng, self.key = rng, key
  def pick(self, xs): return xs[int(self.rng.integers(len(xs)))]
  def chance(self, p): return self.rng.random() < p
  def text(self, n=None):
    n = int(self.rng.integers(0, 40)) if n is None else n
    parts = ["word ", "héllo ", "中文", "\n", "\t", "\u200b", "\U0001F600", "\\", '"', "{{ x }}", "{% raw %}", "\x00", "\x7f", *CONTROL]
    return "".join(self.pick(parts) for _ in range(n))
  def value(self, depth=0):
    r = self.rng.integers(8 if depth < 3 else 5)
    if r == 0: return self.pick(NUMBERS)
    if r == 1: return self.text()
    if r == 2: return float(self.rng.normal() * 10 ** int(self.rng.integers(0, 12)))
    if r == 3: return int(self.rng.integers(-2 ** 40, 2 ** 40))
    if r == 4: return None
    if r == 5: return [self.value(depth + 1) for _ in range(int(self.rng.integers(0, 4)))]
    return {self.text(int(self.rng.integers(1, 4))): self.value(depth + 1) for _ in range(int(self.rng.integers(0, 4)))}
  def content(self):
    r = self.rng.integers(12)
    if r < 8: return self.text()
    if r == 8: return [{"type": "text", "text": self.text()} for _ in range(int(self.rng.integers(1, 3)))]
    if r == 9: return [{"type": self.pick(["image_url", "text", "audio"]), self.pick(["text", "image_url"]): self.value(2)}]
    if r == 10: return self.pick(["BOMB-FORMAT", "BOMB-OUT", "word " * int(self.rng.integers(50, 3000))])
    return self.value(2)
  def message(self):
    m = {"role": self.pick(["user", "assistant", "system", "tool", "", "x" * 100, 5, None]) if self.chance(0.15) else self.pick(["user", "assistant", "system"]),
         "content": self.content()}
    if self.chance(0.1): m[self.text(2)] = self.value(2)
    if self.chance(0.05): del m["content"]
    return m
  def fields(self) -> dict:
    d = {}
    for k, good in [("max_tokens", lambda: int(self.rng.integers(1, 3))), ("temperature", lambda: float(self.rng.uniform(0, 2))),
                    ("top_p", lambda: float(self.rng.uniform(0.1, 1))), ("top_k", lambda: int(self.rng.integers(0, 50))),
                    ("seed", lambda: int(self.rng.integers(0, 2 ** 31))), ("stop", lambda: self.pick(["\n", ["a", "b"], self.text(3)])),
                    ("stream", lambda: self.chance(0.5)), ("n", lambda: 1), ("model", lambda: self.pick(["hostile", "hostile.gguf"])),
                    ("max_completion_tokens", lambda: int(self.rng.integers(1, 3))), ("stream_options", lambda: {"include_usage": self.chance(0.5)})]:
      if self.chance(0.35): d[k] = good() if self.chance(0.8) else self.value(1)
    d.setdefault("max_tokens", int(self.rng.integers(1, 3)))  # generation stays short: the fuzzer's time goes to cases
    if d.get("max_tokens") not in (1, 2) and isinstance(d.get("max_tokens"), int) and not isinstance(d["max_tokens"], bool): d["max_tokens"] = 2
    if d.get("max_completion_tokens") is not None and not (isinstance(d["max_completion_tokens"], int) and 0 < d["max_completion_tokens"] < 3): d["max_completion_tokens"] = 1
    for _ in range(int(self.rng.integers(0, 3))): d[self.text(2)] = self.value(1)
    return d
  def body(self, path: str) -> bytes:
    if path.endswith("chat/completions"): obj = {"messages": [self.message() for _ in range(int(self.rng.integers(0 if self.chance(0.05) else 1, 4)))], **self.fields()}
    elif path.endswith("/completions"):
      p = self.pick([self.text(), self.text(), [int(x) for x in self.rng.integers(0 if self.chance(0.8) else -5, 130000, int(self.rng.integers(1, 20)))],
                     [self.text()], self.value(1), [[1, 2]], "word " * int(self.rng.integers(100, 2000))])
      obj = {"prompt": p, **self.fields()}
      if self.chance(0.1): obj[self.pick(["echo", "logprobs", "suffix"])] = self.value(1)
    else: obj = self.value()
    if self.chance(0.1) and isinstance(obj, dict): obj = [obj]
    raw = json.dumps(obj, ensure_ascii=self.chance(0.5)).encode()
    r = self.rng.integers(16)
    if r == 0: raw = raw[:int(self.rng.integers(len(raw) + 1))]  # cut
    elif r == 1:  # spliced: lone surrogates, huge numbers, JSON's non-standard constants, bytes that are not UTF-8, deep nesting
      at = int(self.rng.integers(len(raw) + 1))
      junk = self.pick([b'"\\ud800"', b'"\\udfff x"', b"1" + b"0" * 400, b"NaN", b"-Infinity", b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
                        b'{"a":' * 3000 + b"1" + b"}" * 3000, b"\\u0000", b"1e999"])
      raw = raw[:at] + junk + raw[at:]
    elif r == 2 and raw:
      b = bytearray(raw)
      for _ in range(int(self.rng.integers(1, 6))): b[int(self.rng.integers(len(b)))] = int(self.rng.integers(256))
      raw = bytes(b)
    elif r == 3: raw = raw.replace(b'"', b'"\\ud83d', 1) if self.chance(0.5) else raw.replace(b"user", b"\\ud800user", 1)
    elif r == 4 and (at := [i + 1 for i in range(len(raw) - 1) if raw[i:i + 2] == b'{"']):  # a key with a value nested deep
      i, n = self.pick(at), int(self.pick([40, 70, 900, 5000, 50000]))  # past the recursion limit (tinygrad sets 10000)
      raw = raw[:i] + b'"deep": ' + b"[" * n + b"1" + b"]" * n + b", " + raw[i:]
    return raw
  def headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
    h = [(b"Host", b"fuzz")]
    r = self.rng.integers(20)
    auth = (b"Bearer " + self.key.encode() if r < 14 else self.pick([b"", b"Bearer", b"bearer " + self.key.encode(), b"Basic eDp5",
            b"Bearer \xff\xfe\x80", b"Bearer " + self.key.encode() + b"\xc3", b"Bearer  " + self.key.encode() + b" ", b"Bearer \xe2\x82"]))
    if r != 19: h.append((b"Authorization", auth))
    if self.chance(0.9): h.append((b"Content-Type", self.pick([b"application/json", b"text/plain", b"application/json; charset=latin-1", b"\xff/\xfe", b""])))
    if self.chance(0.1): h.append((b"Content-Encoding", self.pick([b"gzip", b"deflate", b"br", b"identity", b"x"])))
    for _ in range(int(self.rng.integers(0, 3))):
      name = bytes(int(c) for c in self.rng.choice(list(b"abcdefghijklmnopqrstuvwxyz-XYZ_.:@ \x01\xff"), int(self.rng.integers(1, 12))))
      h.append((name.lstrip(b" ") or b"x", self.rng.integers(0x00, 0x100, int(self.rng.integers(0, 30)), dtype=np.uint8).tobytes().replace(b"\r", b"").replace(b"\n", b"")))
    h.append((b"Content-Length", str(len(body)).encode()))
    h.append((b"Connection", b"close"))
    return h

def exchange(base: str, method: bytes, path: bytes, headers, body: bytes, timeout=30.0) -> bytes:
  host, port = base.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=timeout) as s:
    s.sendall(method + b" " + path + b" HTTP/1.1\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + body)
    out = b""
    try:
      while (d := s.recv(65536)): out += d
    except ConnectionResetError: pass
  return out

def parse(raw: bytes) -> tuple[int, dict, bytes]:
  head, _, body = raw.partition(b"\r\n\r\n")
  lines = head.split(b"\r\n")
  status = int(lines[0].split()[1])
  hdrs = {k.strip().lower(): v.strip() for k, _, v in (l.partition(b":") for l in lines[1:])}
  if hdrs.get(b"transfer-encoding") == b"chunked":
    out = b""
    while body:
      n, _, rest = body.partition(b"\r\n")
      if not (n := int(n.split(b";")[0], 16)): break
      out, body = out + rest[:n], rest[n + 2:]
    body = out
  return status, hdrs, body

def test_fuzz_requests(hostile, rng):
  gen, base = Gen(rng, hostile.key), hostile.base
  paths = [b"/v1/chat/completions"] * 6 + [b"/v1/completions"] * 4 + [b"/v1/models", b"/v1/models/hostile", b"/health", b"/metrics",
           b"/v1/models/%ff%00", b"/v1//chat/completions", b"/" + b"a" * 2000, b"/v1/chat/completions?x=\xff", b"/../etc/passwd"]
  statuses, t_end, cases = {}, time.monotonic() + 15 * SECONDS, 0
  while time.monotonic() < t_end:
    path = gen.pick(paths)
    method = b"POST" if (b"completions" in path and gen.chance(0.9)) else gen.pick([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"HEAD", b"PATCH"])
    body = gen.body(path.decode("latin-1")) if method in (b"POST", b"PUT", b"PATCH") else b""
    headers = gen.headers(body)
    case = f"case {cases + 1}: {method.decode()} {path[:80]!r} headers {headers!r:.600} body {body[:600]!r}"
    n = len(hostile.log.records)
    raw = exchange(base, method, path, headers, body)
    cases += 1
    assert raw, f"no response to {case}"
    status, hdrs, content = parse(raw)
    statuses[status] = statuses.get(status, 0) + 1
    assert status < 500, f"{status} {content[:300]!r} for {case}"
    if status >= 400 and method != b"HEAD":
      assert hdrs.get(b"content-type", b"").startswith(b"application/json"), f"{status} {hdrs} {content[:200]!r} for {case}"
      err = json.loads(content)["error"]
      assert set(err) == {"message", "type", "param", "code"} and err["message"], f"{err} for {case}"
    elif status == 200 and b"completions" in path and method == b"POST":
      text = content.decode()
      assert text.rstrip().endswith("data: [DONE]") if hdrs.get(b"content-type", b"").startswith(b"text/event-stream") else "choices" in json.loads(text), case
    t0 = time.monotonic()
    with urllib.request.urlopen(base + "/health", timeout=5) as r: assert r.status == 200, case
    assert time.monotonic() - t0 < 1.0, f"/health took {time.monotonic() - t0:.2f} s after {case}"
    assert not hostile.log.problems(n), f"{hostile.log.problems(n)} after {case}"
  FUZZ_COUNTS["HTTP requests"] = f"{cases} requests ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))})"
  assert cases >= 50 and statuses.get(200, 0) >= 5, statuses
