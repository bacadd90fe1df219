#!/usr/bin/env python3
"""The server's host costs under N streaming clients, on the CPU: `orin-llm serve`'s own HTTP handlers, worker and
scheduler, in a process of their own, over an engine that only keeps time. Each step it queues holds the host for
--queue-ms (Python spinning, as tinygrad holds the GIL to queue a CUDA graph) and occupies a simulated device for its
time (--step-ms by rows); waiting for tokens sleeps until the device is done (the GIL released, as a device wait does).
The tokens are random ordinary ids of a real vocabulary, so the detokenizer does its real work. What a stream's rate
loses against the device's (1 / step) is the host's: the handlers, the events between the threads, the detokenizer,
the scheduler. Clients are load_bench.py's (the same prompts, rounds and figures). Device defaults: the 1B Q6_K's
steps on an H100 (docs/PERF.md, fifty-second session). The host here is not the GPU machine's: compare runs of one
machine, changed and unchanged, alternated.
  host_load.py [--vocab GGUF] [--parallel 1,4,8] [--tokens 128] [--rounds 3] [--step-ms 1:1.04,2:1.3,4:1.443,8:1.593]
               [--queue-ms 0.3] [--prompt-ms 2.5] [--gather-ms 0] [--port 18091] [--server-cpus 1] [--json OUT]"""
import argparse, asyncio, json, pathlib, sys, time
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE))
VOCAB = HERE.parent.parent / "shared" / "data" / "ggml-vocab-llama-bpe.gguf"

class Slot:
  def __init__(self): self.cached, self.next, self.sampling = [], None, None

class TimedEngine:
  """The engine's interface as the server uses it (decode, prefill_chunks, prefill_together, first_token, ...); its
  steps cost host and device time and choose random ordinary tokens."""
  def __init__(self, file, vocab: int, max_batch: int, step_s: dict, queue_s: float, prompt_s: float, context: int = 4096):
    from types import SimpleNamespace
    self.file, self.cfg = file, SimpleNamespace(vocab_size=vocab)
    self.max_batch, self.max_context, self.slots = max_batch, context, [Slot() for _ in range(max_batch)]
    self.batch_sizes = tuple(b for b in (2, 4, 8, 16, 32, 64) if b <= max(2, max_batch))
    self.group_rows, self.speculator = 16, None
    self.step_s, self.queue_s, self.prompt_s = step_s, queue_s, prompt_s
    self.dev, self.busy, self._ahead = time.perf_counter(), 0.0, None
    self.rng = np.random.default_rng(1)
    self.lo, self.hi = min(1000, vocab // 4), min(vocab, 100000)
  # the device: a timeline of queued work
  def _queue(self, seconds: float):
    # the host queueing a step: Python holds the GIL between calls into the driver (ctypes releases it in each): here
    # 25 us of spinning at a time, then a release
    t = time.perf_counter() + self.queue_s
    while (now := time.perf_counter()) < t:
      u = min(t, now + 25e-6)
      while time.perf_counter() < u: pass
      time.sleep(0)
    self.dev = max(self.dev, time.perf_counter()) + seconds
    self.busy += seconds
  def _wait(self, until: float):
    if (d := until - time.perf_counter()) > 0: time.sleep(d)
  def _step(self, rows: int) -> float: return self.step_s[min((b for b in self.step_s if b >= rows), default=max(self.step_s))]
  def _token(self) -> int: return int(self.rng.integers(self.lo, self.hi))
  # the interface
  def check_prompt(self, prompt):
    from orin_llm.errors import OrinError
    if not prompt or len(prompt) >= self.max_context: raise OrinError("bad prompt length")
  def common_prefix(self, slot, toks):  # the engine's own (it reads only the slots)
    from orin_llm.engine import Engine
    return Engine.common_prefix(self, slot, toks)
  def reset(self, slot=None):
    for s in self.slots: s.cached, s.next = [], None
  def set_mask(self, slot, mask): pass
  def prefill_chunks(self, slot, toks, sampling=None, mask=None):
    s = self.slots[slot]
    s.cached, s.next, s.sampling, self._ahead = toks[:-1], None, sampling, None
    self._queue(self.prompt_s)
    s.cached = list(toks)
    yield len(toks)
  def prefill_together(self, jobs: dict) -> dict:
    for slot, (toks, sampling) in jobs.items():
      self.slots[slot].cached, self.slots[slot].next, self.slots[slot].sampling = list(toks), None, sampling
    self._ahead = None
    self._queue(self.prompt_s * 1.5)
    return {slot: len(toks) for slot, (toks, _) in jobs.items()}
  def first_token(self, slot):
    s = self.slots[slot]
    if s.next is None:
      self._wait(self.dev)
      s.next = self._token()
    return s.next
  def fetch_first(self, slots):  # the copy has its place behind the steps queued so far
    self._fetch = (self.dev, list(slots))
  def read_first(self):
    (ready, slots), self._fetch = self._fetch, None
    self._wait(ready)
    for b in slots:
      if self.slots[b].next is None: self.slots[b].next = self._token()
    return {b: self.slots[b].next for b in slots}
  def decode(self, slots, n, masks=None, ahead=False):
    B = 1 if len(slots) == 1 else next(b for b in self.batch_sizes if b > max(slots))
    step = self._step(B)
    key = (tuple(slots), tuple(len(self.slots[s].cached) for s in slots))
    started, self._ahead = self._ahead == key, None
    for i in range(n):
      if i or not started: self._queue(step)
    ready = self.dev
    if ahead:  # the next round's first step, queued before the host reads this round's tokens (engine.decode)
      self._queue(step)
      self._ahead = (tuple(slots), tuple(len(self.slots[s].cached) + n for s in slots))
    self._wait(ready)
    out = self.rng.integers(self.lo, self.hi, (n, len(slots)))
    for j, s in enumerate(slots):
      c = self.slots[s]
      c.cached, c.next = c.cached + [c.next] + out[:n - 1, j].tolist(), int(out[n - 1, j])
    return out

def serve(args):
  """The server process: cli.serve with the timed engine."""
  from orin_llm.gguf_file import GGUFFile
  from orin_llm.tokenizer import Tokenizer
  from orin_llm.server import cli, config
  from orin_llm.server import worker as W
  W.Worker._warm_up = lambda self: None  # nothing to compile
  step_s = {int(k): float(v) / 1e3 for k, v in (p.split(":") for p in args.step_ms.split(","))}
  cfg = config.from_dict({"model": str(args.vocab), "port": args.port, "max_batch": max(int(n) for n in args.parallel.split(",")),
                          "queue_size": 64, "gather_ms": args.gather_ms})
  f = GGUFFile(args.vocab)
  vocab = len(f.metadata["tokenizer.ggml.tokens"])
  eng = TimedEngine(f, vocab, cfg.max_batch, step_s, args.queue_ms / 1e3, args.prompt_ms / 1e3)
  t0 = time.perf_counter()
  def load(cfg): return eng, Tokenizer.from_metadata(f.metadata)
  try: asyncio.run(cli.serve(cfg, load=load))
  finally: print(f"host_load: device busy {eng.busy:.3f} s of {time.perf_counter() - t0:.3f} s", file=sys.stderr)

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--vocab", default=str(VOCAB), help="a GGUF file with a vocabulary (default ../shared/data's Llama 3)")
  ap.add_argument("--parallel", default="1,4,8")
  ap.add_argument("--tokens", type=int, default=128)
  ap.add_argument("--prompt-tokens", type=int, default=16)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--step-ms", default="1:1.04,2:1.3,4:1.443,8:1.593", help="device ms of a decode step by rows (rows:ms,...)")
  ap.add_argument("--queue-ms", type=float, default=0.3, help="host ms to queue a step (default 0.3, the H100's)")
  ap.add_argument("--prompt-ms", type=float, default=2.5, help="device ms of a short prompt's step (default 2.5)")
  ap.add_argument("--gather-ms", type=float, default=0.0)
  ap.add_argument("--port", type=int, default=18091)
  ap.add_argument("--server-cpus", help="CPUs of the server process (taskset -c; e.g. 1 with the clients on 0: "
                  "separate cores, as on the GPU machine, where they do not compete)")
  ap.add_argument("--json", help="also write the results to this file")
  ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server process
  args = ap.parse_args()
  if args.serve: return serve(args)
  import load_bench
  ns = [int(n) for n in args.parallel.split(",")]
  url = f"http://127.0.0.1:{args.port}"
  pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
  proc = load_bench.start([*pin, sys.executable, __file__, "--serve", *sys.argv[1:]], url, pathlib.Path(f"/tmp/host_load-{args.port}.log"), 120)
  try:
    from orin_llm.gguf_file import GGUFFile
    vocab = len(GGUFFile(args.vocab).metadata["tokenizer.ggml.tokens"])
    res = {"ours": load_bench.measure(url, args, ns, vocab, np.random.default_rng(0))}
  finally: load_bench.stop(proc)
  step = {int(k): float(v) for k, v in (p.split(":") for p in args.step_ms.split(","))}
  for n in ns:
    s, ms = res["ours"][n], step[min((b for b in step if b >= n), default=max(step))]
    s["device_tok_s"] = 1e3 / ms  # a stream's rate were the host free
    print(f"  N {n}: aggregate {s['aggregate_tok_s']:8.1f} tok/s, per stream {s['per_stream_tok_s']:7.1f} "
          f"({s['per_stream_tok_s'] / s['device_tok_s']:.1%} of the device's {s['device_tok_s']:.1f}), TTFT median {s['ttft_ms_median']:.1f} ms"
          + "".join(f", {k[:-10]} {s[k]:.1f}" for k in (f"{k}_median" for k in load_bench.PHASES + ("ttft_rest_ms",)) if k in s))
  print(pathlib.Path(f"/tmp/host_load-{args.port}.log").read_text().strip().splitlines()[-1])
  if args.json: pathlib.Path(args.json).write_text(json.dumps(res, indent=1))

if __name__ == "__main__": main()
