#!/usr/bin/env python3
"""Start-up of `orin-llm serve` as a user meets it: seconds from start to READY (/health 200), then
one streamed completion: time to first token and the decode speed of its first 32 tokens. Run it
twice on the same cache directory for the cold and the prewarmed figure (issue: prewarmed kernel cache).
  ready_time.py MODEL --cache DIR [--beam N] [--port P] [--context N]"""
import argparse, json, os, signal, subprocess, sys, tempfile, threading, time, urllib.request

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--cache", required=True)
ap.add_argument("--beam", type=int, default=2); ap.add_argument("--port", type=int, default=18080)
ap.add_argument("--context", type=int, default=1024); ap.add_argument("--timeout", type=float, default=900)
a = ap.parse_args()
cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
cfg.write(f'model = "{a.model}"\nport = {a.port}\ncontext_length = {a.context}\n[beam]\nwidth = {a.beam}\n'
          f'[kernel_cache]\ndirectory = "{a.cache}"\n')
cfg.close()
base = f"http://127.0.0.1:{a.port}"
# a SIGTERM (from `timeout`) must still stop the server below, or it keeps the port for the next run
signal.signal(signal.SIGTERM, lambda *_: sys.exit("ready_time: terminated"))
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-m", "orin_llm", "serve", "--config", cfg.name], stderr=subprocess.PIPE)
def copy_log():  # the server's log lines, stamped with seconds since its start: where the start-up goes
  with open(os.path.join(a.cache, "serve.log"), "a") as f:
    for line in proc.stderr: f.write(f"[{time.monotonic() - t0:7.2f}] {line.decode(errors='replace')}"); f.flush()
threading.Thread(target=copy_log, daemon=True).start()
health = None
try:
  while time.monotonic() - t0 < a.timeout:
    if proc.poll() is not None: sys.exit(f"server exited with {proc.returncode} (see {a.cache}/serve.log)")
    try:
      with urllib.request.urlopen(base + "/health", timeout=2) as r:
        if r.status == 200: health = json.loads(r.read()); break
    except Exception: pass
    time.sleep(0.2)
  ready = time.monotonic() - t0
  if health is None:  # a cold start still searching: say so, and no request
    print(json.dumps({"ready_s": None, "not_ready_after_s": round(ready, 1)}))
    sys.exit(1)
  body = json.dumps({"prompt": "The history of the city begins", "max_tokens": 64, "temperature": 0, "stream": True}).encode()
  req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
  t1, stamps = time.monotonic(), []
  with urllib.request.urlopen(req, timeout=600) as r:
    for line in r:
      if line.startswith(b"data: {"): stamps.append(time.monotonic())
  ttft = stamps[0] - t1
  first32 = (min(33, len(stamps)) - 1) / (stamps[min(32, len(stamps) - 1)] - stamps[0]) if len(stamps) > 2 else float("nan")
  print(json.dumps({"ready_s": round(ready, 2), "ttft_ms": round(1e3 * ttft, 1), "first_32_tok_s": round(first32, 1),
                    "tokens": len(stamps), "kernel_cache": (health or {}).get("kernel_cache")}))
finally:
  proc.terminate(); proc.wait(60)
