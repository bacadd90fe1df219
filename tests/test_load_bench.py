"""scripts/load_bench.py against our server on the CPU (a small model, few tokens) and a stand-in
llama-server that streams what llama-server streams."""
import json, os, pathlib, random, socket, subprocess, sys
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB, ROOT

FAKE_LLAMA_SERVER = '''
import asyncio, json, sys, time
from aiohttp import web
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
open(sys.argv[0] + ".calls", "a").write(" ".join(sys.argv[1:]) + "\\n")
t0 = time.monotonic()
async def health(r):  # 503 while "loading", as llama-server does
  ok = time.monotonic() - t0 > 0.5
  return web.json_response({"status": "ok" if ok else "loading model"}, status=200 if ok else 503)
async def completions(r):
  body = await r.json()
  assert body["ignore_eos"] is True and body["temperature"] == 0 and all(isinstance(i, int) for i in body["prompt"])
  resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
  await resp.prepare(r)
  send = lambda ev: resp.write(b"data: " + json.dumps(ev).encode() + b"\\n\\n")
  for i in range(body["max_tokens"]):
    await asyncio.sleep(0.005)
    await send({"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]})
  await send({"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "timings": {"predicted_n": body["max_tokens"]}})
  await resp.write(b"data: [DONE]\\n\\n")
  return resp
app = web.Application()
app.router.add_get("/health", health); app.router.add_post("/v1/completions", completions)
web.run_app(app, host=a["--host"], port=int(a["--port"]), print=None)
'''

def free_port_pair() -> int:
  for _ in range(100):
    p = random.randrange(20000, 60000)
    try:
      with socket.socket() as a, socket.socket() as b: a.bind(("127.0.0.1", p)); b.bind(("127.0.0.1", p + 1))
      return p
    except OSError: continue
  raise RuntimeError("no free port pair")

def test_load_bench(tmp_path):
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q4_K, LLAMA_VOCAB, vocab_size=512)
  fake, out = tmp_path / "llama-server", tmp_path / "load.json"
  fake.write_text(f"#!{sys.executable}\n" + FAKE_LLAMA_SERVER); fake.chmod(0o755)  # aiohttp: this venv's python
  r = subprocess.run([sys.executable, ROOT / "scripts/load_bench.py", "--model", model, "--llama-server", fake, "--parallel", "1,2",
                      "--tokens", "6", "--rounds", "2", "--port", str(free_port_pair()), "--json", out, "--logs", tmp_path / "logs"],
                     capture_output=True, text=True, timeout=600, env={**os.environ, "DEV": "CPU", "PYTHONPATH": str(ROOT)})
  assert r.returncode == 0, r.stdout + r.stderr[-3000:]
  res = json.loads(out.read_text())
  for n in ("1", "2"):
    o, ll = res["ours"][n], res["llama_cpp"][n]
    assert o["streams"] == ll["streams"] == 2 * int(n)
    assert ll["tokens"] == 6 * 2 * int(n) and ll["ended_early"] == 0 and ll["per_stream_tok_s"] > 0
    assert o["tokens"] <= 6 * 2 * int(n) and o["tokens"] - o["ended_early"] * 6 > 0  # ours stops at EOS: counted, not hidden
    assert 0 < o["ttft_ms_median"] <= o["ttft_ms_p95"] and o["aggregate_tok_s"] > 0
    # the server's split of the time to the first token (its timings): within the client's, the rest the way back
    assert all(o[f"{k}_median"] >= 0 for k in ("request_ms", "queued_ms")) and o["prompt_ms_median"] > 0
    assert 0 < o["ttft_server_ms_median"] and o["ttft_rest_ms_median"] >= 0 and "ttft_server_ms_median" not in ll
    # when each request was sent (aiohttp's trace), and each round's streams from its first start
    for x in (o, ll):
      assert 0 <= x["send_spread_ms_median"] and 0 <= x["sent_ms_median"] < x["ttft_ms_median"]
      assert len(x["detail"]) == 2 and all(len(r) == int(n) for r in x["detail"])
      assert min(s["start"] for s in x["detail"][0]) == 0
      assert all(s["start"] <= s["sent"] <= s["first"] <= s["last"] for r in x["detail"] for s in r)
    assert res["ratio"][f"aggregate_n{n}"] > 0
  calls = (tmp_path / "llama-server.calls").read_text().splitlines()
  assert [c.split("-np ")[1].split()[:3] for c in calls] == [["1", "-c", "4096"], ["2", "-c", "8192"]] and "-fa on" in calls[0]
  assert "orin-llm" in r.stdout and "llama.cpp" in r.stdout and "ours/llama.cpp" in r.stdout
