#!/usr/bin/env python3
"""Serving under load, ours against llama.cpp on the same file in one invocation: `orin-llm serve`, then
(given its path) llama-server with -np N for each N, each driven by N concurrent streaming clients for
each N of --parallel. A client sends a prompt of --prompt-tokens random token ids (the same ids reach
both servers, no tokenizer in between) and asks for --tokens tokens at temperature 0 with EOS ignored
(llama-server's ignore_eos; ours has no such field and stops at EOS, which random weights rarely pick:
a stream that ends early is counted). Per N: aggregate tok/s (every token of the round over its wall
time), per-stream tok/s (after its first token), time to first token (median, p95 over all streams),
when the requests were sent (their spread in a round), and each round's streams (JSON's "detail").
Ours starts once, with a slot per client of the largest N (--max-batch); llama-server starts for each N.
  load_bench.py --model F [--llama-server PATH] [--parallel 1,2,4,8] [--tokens 128] [--rounds 3]
                [--config TOML] [--max-batch B] [--port 18081] [--json OUT] [--logs DIR]"""
import argparse, asyncio, json, os, pathlib, signal, subprocess, sys, tempfile, time
import numpy as np
import aiohttp

def start(cmd: list[str], url: str, log: pathlib.Path, timeout: float) -> subprocess.Popen:
  """Starts a server and waits for its /health to answer 200 (both answer 503 while loading)."""
  print(f"load_bench: starting {' '.join(map(str, cmd))} (log {log})", file=sys.stderr, flush=True)
  f = open(log, "ab")
  proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
  t0 = time.monotonic()
  async def ready() -> bool:
    async with aiohttp.ClientSession() as s:
      while time.monotonic() - t0 < timeout:
        if proc.poll() is not None: return False
        try:
          async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
            if r.status == 200: return True
        except (aiohttp.ClientError, asyncio.TimeoutError): pass
        await asyncio.sleep(0.2)
    return False
  if not asyncio.run(ready()):
    stop(proc)
    tail = log.read_text(errors="replace").splitlines()[-15:]
    sys.exit("load_bench: " + (f"server exited with {proc.returncode}" if proc.returncode not in (None, -15) else f"not ready after {timeout:.0f} s")
             + f": {' '.join(map(str, cmd))}\n" + "\n".join(tail))
  print(f"load_bench: ready after {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
  return proc

def stop(proc: subprocess.Popen):
  if proc.poll() is None:
    proc.send_signal(signal.SIGTERM)
    try: proc.wait(60)
    except subprocess.TimeoutExpired: proc.kill(); proc.wait()

def sent_times() -> aiohttp.TraceConfig:
  """A session's trace that puts in each request's trace_request_ctx (a dict) when its headers and body were last
  handed to the socket ("sent"): clients started together send from one event loop, one after another."""
  tc = aiohttp.TraceConfig()
  async def sent(session, ctx, params):
    if isinstance(ctx.trace_request_ctx, dict): ctx.trace_request_ctx["sent"] = time.perf_counter()
  tc.on_request_headers_sent.append(sent); tc.on_request_chunk_sent.append(sent)
  return tc

async def stream(s: aiohttp.ClientSession, url: str, prompt: list[int], n: int) -> dict:
  """One streamed completion: times of its start, its request sent, its first and last text chunks, tokens, finish reason."""
  body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True,
          "stream_options": {"include_usage": True}}
  t0 = time.perf_counter()
  first = last = usage = finish = predicted = timings = None
  chunks, seen, trace = 0, [], {}
  async with s.post(url + "/v1/completions", json=body, trace_request_ctx=trace) as r:
    if r.status != 200: raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.text())[:300]}")
    async for line in r.content:
      if len(seen) < 6: seen.append(line[:300])
      if not line.startswith(b"data: {"): continue
      now, ev = time.perf_counter(), json.loads(line[6:])
      usage = ev.get("usage") or usage
      timings = ev.get("timings") or timings  # the server's own times of the request (both send them in a last chunk)
      predicted = (ev.get("timings") or {}).get("predicted_n", predicted)  # llama-server's own count
      for c in ev.get("choices", []):
        # a token's chunk may carry no text (llama-server holds back an incomplete UTF-8 sequence, and random token ids
        # make many): every chunk of a token counts for its timing, the last one (finish_reason only) does not
        if c.get("finish_reason") is None: chunks, first, last = chunks + 1, first or now, now
        finish = c.get("finish_reason") or finish
  # tokens: the usage counts; else llama.cpp's timings; else one chunk per token (llama-server sends each token)
  tokens = usage["completion_tokens"] if usage else predicted if predicted is not None else chunks
  if first is None:
    # llama-server -np 2 once sent a whole answer as its final event (text "", usage 128 tokens): no token timings
    if not tokens: raise RuntimeError(f"{url}: a stream ended without a token (finish_reason {finish}); its first lines: {seen}")
    first = last = time.perf_counter()
    print(f"load_bench: {url}: a stream sent its {tokens} tokens at once, at its end (counted; its TTFT is its whole time)", file=sys.stderr)
  return {"start": t0, "sent": trace.get("sent"), "first": first, "last": last, "tokens": tokens, "finish": finish, "timings": timings or {}}

async def rounds(url: str, n: int, n_rounds: int, tokens: int, prompt_tokens: int, vocab: int, rng) -> list[list[dict]]:
  lo, hi = min(1000, vocab // 4), min(vocab, 100000)  # ordinary tokens: not the special ones at the top of the vocabulary
  out = []
  async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=600), trace_configs=[sent_times()]) as s:
    for _ in range(n_rounds):
      out.append(await asyncio.gather(*[stream(s, url, rng.integers(lo, hi, prompt_tokens).tolist(), tokens) for _ in range(n)]))
  return out

PHASES = ("request_ms", "queued_ms", "prompt_ms")  # the server's own split of a request's time to its first token

def phases(streams: list[dict]) -> dict:
  """Medians of the server's timings over the streams that have them: each phase before the first token (ours:
  server/worker.timings; llama-server has prompt_ms), their sum, and the rest of the client's time to its first token
  (the way there and back: HTTP, the event loop, the stream's first chunk)."""
  out = {}
  for k in PHASES:
    v = [x["timings"][k] for x in streams if x["timings"].get(k) is not None]
    if v: out[f"{k}_median"] = float(np.median(v))
  full = [x for x in streams if all(x["timings"].get(k) is not None for k in PHASES)]
  if full:
    server = [sum(x["timings"][k] for k in PHASES) for x in full]
    out["ttft_server_ms_median"] = float(np.median(server))
    out["ttft_rest_ms_median"] = float(np.median([(x["first"] - x["start"]) * 1e3 - t for x, t in zip(full, server)]))
  return out

def detail(rs: list[list[dict]]) -> list[list[dict]]:
  """Each round's streams, times in ms from the round's first start: when a first token waits, whether its request
  reached the server late (sent) or waited there (the server's timings)."""
  def ms(t, t0): return None if t is None else round((t - t0) * 1e3, 3)
  return [[{"start": ms(x["start"], t0), "sent": ms(x["sent"], t0), "first": ms(x["first"], t0), "last": ms(x["last"], t0),
            "tokens": x["tokens"], "timings": x["timings"]} for x in r] for r in rs for t0 in [min(x["start"] for x in r)]]

def summary(rs: list[list[dict]], tokens: int) -> dict:
  streams = [x for r in rs for x in r]
  agg = [sum(x["tokens"] for x in r) / (max(x["last"] for x in r) - min(x["start"] for x in r)) for r in rs]
  per = [(x["tokens"] - 1) / (x["last"] - x["first"]) for x in streams if x["tokens"] > 1 and x["last"] > x["first"]]
  ttft = np.array([x["first"] - x["start"] for x in streams]) * 1e3
  return {"aggregate_tok_s": float(np.median(agg)), "per_stream_tok_s": float(np.median(per)) if per else None,
          "per_stream_tok_s_min": float(min(per)) if per else None, "ttft_ms_median": float(np.median(ttft)),
          "ttft_ms_p95": float(np.percentile(ttft, 95)), "streams": len(streams),
          "ended_early": sum(x["tokens"] < tokens for x in streams), "tokens": sum(x["tokens"] for x in streams), **phases(streams),
          **sends(rs), "detail": detail(rs)}

def sends(rs: list[list[dict]]) -> dict:
  """The medians over rounds of the spread of the requests' sending (the last one's sent - the first one's) and over
  streams of each request's sent - start."""
  if any(x["sent"] is None for r in rs for x in r): return {}
  return {"send_spread_ms_median": float(np.median([(max(x["sent"] for x in r) - min(x["sent"] for x in r)) * 1e3 for r in rs])),
          "sent_ms_median": float(np.median([(x["sent"] - x["start"]) * 1e3 for r in rs for x in r]))}

def measure(url: str, args, ns: list[int], vocab: int, rng) -> dict:
  asyncio.run(rounds(url, 1, 1, 8, args.prompt_tokens, vocab, rng))  # warm-up: first-request costs stay out of the figures
  return {n: summary(asyncio.run(rounds(url, n, args.rounds, args.tokens, args.prompt_tokens, vocab, rng)), args.tokens) for n in ns}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", "-m", required=True)
  ap.add_argument("--llama-server", help="llama-server binary (none: ours only)")
  ap.add_argument("--parallel", default="1,2,4,8", help="concurrent clients, comma-separated (default 1,2,4,8)")
  ap.add_argument("--tokens", type=int, default=128, help="tokens each client asks for (default 128)")
  ap.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
  ap.add_argument("--rounds", type=int, default=3, help="rounds of N concurrent requests per N (default 3)")
  ap.add_argument("--config", help="TOML config for orin-llm serve (BEAM, kernel cache; --model, --port, --max-batch override it)")
  ap.add_argument("--max-batch", type=int, help="our server's slots, requests generating at once (default: the most clients)")
  ap.add_argument("--port", type=int, default=18081, help="our server's port; llama-server gets the next (default 18081)")
  ap.add_argument("--timeout", type=float, default=900, help="seconds a server may take to become ready (default 900)")
  ap.add_argument("--json", help="also write the results to this file")
  ap.add_argument("--logs", help="directory for the servers' logs (default: a temporary one)")
  args = ap.parse_args()
  ns = [int(n) for n in args.parallel.split(",")]
  logs = pathlib.Path(args.logs or tempfile.mkdtemp(prefix="load-bench-"))
  logs.mkdir(parents=True, exist_ok=True)
  from orin_llm.gguf_file import GGUFFile
  vocab = len(GGUFFile(args.model).metadata["tokenizer.ggml.tokens"])
  rng = np.random.default_rng(0)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit("load_bench: terminated"))  # finally: below still stops the servers
  res = {"model": args.model, "tokens": args.tokens, "prompt_tokens": args.prompt_tokens, "rounds": args.rounds,
         "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
  url = f"http://127.0.0.1:{args.port}"
  # one start for every N, a slot for each client of the largest (llama-server below starts for each N with -np N)
  cmd = [sys.executable, "-m", "orin_llm", "serve", "--model", args.model, "--port", str(args.port), "--queue-size", str(max(16, *ns)),
         "--max-batch", str(args.max_batch or max(ns))]
  proc = start(cmd + (["--config", args.config] if args.config else []), url, logs / "orin-llm.log", args.timeout)
  try:
    res["ours"] = measure(url, args, ns, vocab, rng)
    print_table(res, ns)  # printed at once: a later failure keeps these on the console
  finally: stop(proc)
  save(res, args.json)  # ours kept even if llama-server's part fails
  if args.llama_server:
    res["llama_cpp"], url = {}, f"http://127.0.0.1:{args.port + 1}"
    for n in ns:  # -np N slots of 4096 tokens each: N requests decode together (continuous batching)
      cmd = [args.llama_server, "-m", args.model, "-ngl", "99", "-fa", "on", "-np", str(n), "-c", str(4096 * n),
             "--host", "127.0.0.1", "--port", str(args.port + 1)]
      proc = start(cmd, url, logs / f"llama-server-np{n}.log", args.timeout)
      try: res["llama_cpp"][n] = measure(url, args, [n], vocab, rng)[n]
      except RuntimeError as e: print(f"load_bench: llama-server -np {n}: {e}", file=sys.stderr)
      finally: stop(proc)
      save(res, args.json)
    res["ratio"] = {f"aggregate_n{n}": res["ours"][n]["aggregate_tok_s"] / res["llama_cpp"][n]["aggregate_tok_s"] for n in ns if n in res["llama_cpp"]}
  print_table(res, ns)
  save(res, args.json)

def save(res: dict, path: str | None):
  if path:
    with open(path, "w") as f: json.dump(res, f, indent=1)

def print_table(res: dict, ns: list[int]):
  print(f"load bench: {os.path.basename(res['model'])}, {res['tokens']} tokens per stream after {res['prompt_tokens']} prompt tokens, "
        f"rounds per N: {res['rounds']}")
  print(f"  {'server':<10} {'N':>3} {'aggregate tok/s':>16} {'per stream tok/s':>17} {'TTFT median / p95 ms':>21} {'ended early':>12}  ours/llama.cpp")
  for n in ns:
    for who, key in (("llama.cpp", "llama_cpp"), ("orin-llm", "ours")):
      if n not in res.get(key, {}): continue
      s, ratio = res[key][n], res.get("ratio", {}).get(f"aggregate_n{n}") if key == "ours" else None
      per = f"{s['per_stream_tok_s']:.1f}" if s["per_stream_tok_s"] else "-"
      line = (f"  {who:<10} {n:>3} {s['aggregate_tok_s']:>16.1f} {per:>17} {s['ttft_ms_median']:>11.1f} / {s['ttft_ms_p95']:<7.1f} "
              f"{s['ended_early']:>4} of {s['streams']:<3}  " + (f"{ratio:.2f}x" if ratio else ""))
      print(line.rstrip())
      if (p := [f"{k[:-10]} {s[k]:.1f}" for k in (f"{k}_median" for k in PHASES + ("ttft_rest_ms",)) if k in s]):
        print(f"  {'':<10} {'':>3} time to first token, server's medians in ms: {', '.join(p)}")
      if "send_spread_ms_median" in s:
        print(f"  {'':<10} {'':>3} requests sent {s['sent_ms_median']:.1f} ms after their start (median), the last of a round "
              f"{s['send_spread_ms_median']:.1f} ms after the first (median of rounds)")

if __name__ == "__main__": main()
