"""`orin-llm bench`: decode and prefill speed of our engine, and of llama.cpp's llama-bench on the
same file in the same invocation, with the ratio ours / llama.cpp for each figure: decode after each
--depth tokens of context (llama-bench -d), prefill of each --prompt length (llama-bench -p)."""
from __future__ import annotations
import json, os, shutil, statistics, subprocess, time
import numpy as np
from orin_llm.errors import OrinError
from orin_llm import log, settings

def add_parser(sub):
  p = sub.add_parser("bench", help="measure decode/prefill speed, side by side with llama.cpp")
  p.add_argument("--model", "-m", help="GGUF model file (default: the default model)")
  p.add_argument("--llama-bench", help="llama-bench binary (default: llama-bench on PATH, if any)")
  p.add_argument("--json", help="also write the results to this file")
  p.add_argument("--beam", type=int, default=None, help="BEAM search width for kernel optimization (default: tinygrad's BEAM env)")
  p.add_argument("--tokens", "-n", type=int, default=128, help="decoded tokens to time (default 128)")
  p.add_argument("--prompt", default=None, help="prefill lengths, comma-separated (default 32,512,2048, clipped to the context)")
  p.add_argument("--depth", default=None, help="tokens in the context before the timed decode, comma-separated "
                 "(default 0,1024,4096, clipped to the context)")
  p.add_argument("--temperature", type=float, default=0.0, help="decode and prefill with this temperature (default 0: greedy, "
                 "as llama-bench compares; the server's requests default to 1.0, sampled on the device)")
  p.add_argument("--lookahead", type=int, default=None, help="decode steps queued before the host reads tokens (default: the engine's, as served)")
  p.add_argument("--context", type=int, default=None, help="context to allocate (default: what the longest prompt or depth needs)")
  p.add_argument("--max-batch", type=int, default=None, help="slots, as the server's (default 4): the kernels the server runs, slot and all")
  p.add_argument("--prefill-copy-mb", type=int, default=None, help="MiB for float16 copies of the layers' matrices that "
                 "prefill multiplies, as the server's prefill_copy_mb (default 8192; 0: none, each chunk dequantizes)")
  p.add_argument("--json-schema", metavar="FILE", help="also time decode constrained to this JSON schema against free decode, same "
                                                        "engine and prompt (e.g. scripts/bench-schema.json)")
  p.set_defaults(fn=cmd_bench)

DEFAULT_PROMPTS, DEFAULT_DEPTHS = (32, 512, 2048), (0, 1024, 4096)
WARM = 32  # decoded tokens before the timed ones

def fit(lens: list[int], room: int, context: int, given: bool, what: str, flag: str) -> list[int]:
  """Lengths of at most `room` (what the context leaves them): lengths the user gave must be, the defaults are
  clipped to it with a note (a model of context 2048 gets prefill lengths 32, 512 and 2047)."""
  if given:
    if max(lens) > room:
      raise OrinError(f"{flag} {max(lens)}: the context holds {context} tokens ({what} and the tokens after them); "
                      "give shorter ones or a longer --context (the model's own is the most)")
    return lens
  fit = sorted({min(n, room) for n in lens})
  if fit != lens:
    log.info(f"bench: the context holds {context} tokens: {what} {','.join(map(str, fit))} instead of "
             f"{','.join(map(str, lens))} ({flag} and --context choose others)")
  return fit

def generate(eng, prompt: list[int], n: int, lookahead: int | None = None, temperature: float = 0.0):
  """eng.generate from an empty cache, greedy or sampled at `temperature` (seed 1): the bench's one way into the
  engine's generation API."""
  from orin_llm.sampling import Sampling
  eng.reset()
  return eng.generate(prompt, n, Sampling(temperature, seed=1), **({} if lookahead is None else {"lookahead": lookahead}))

def decode_bytes(eng) -> int:
  """Bytes one decode step must read: every weight plane once, except the embedding table, of which
  only a row is read (unless the output head is tied to it and reads it whole)."""
  total = 0
  for name, w in eng.weights.items():
    if name == "token_embd.weight" and not eng.cfg.tied_output: continue
    total += w.nbytes()
  return total

def kv_bytes(eng, position: float) -> float:
  """Bytes of the float16 KV cache a decode step at `position` reads: every layer's keys and values of the tokens
  before it (what it must read; the attention reads whole blocks of keys, a little more)."""
  c = eng.cfg
  return c.n_layers * 2 * c.n_kv_heads * c.head_dim * 2 * position

def copy_bandwidth(device: str, reps: int = 10) -> dict:
  """Bytes read plus bytes written per second of a large device-to-device copy, in this run: what decode's effective
  bandwidth is a share of (issue 18). The driver's copy where tinygrad's allocator has one (CUDA: cuMemcpyDtoDAsync,
  as the issue measured it), else tinygrad's copy kernel. 512 MiB (64 MiB on the CPU backend: the tests' machine)."""
  from tinygrad import Tensor, Device, dtypes
  nbytes = (64 if device.upper().startswith("CPU") else 512) * 2**20
  src = Tensor.ones(nbytes // 4, dtype=dtypes.float32, device=device).contiguous().realize()
  dst = Tensor.zeros(nbytes // 4, dtype=dtypes.float32, device=device).contiguous().realize()
  dev = Device[device]
  alloc, sb, db = dev.allocator, src.uop.buffer, dst.uop.buffer
  if getattr(alloc, "supports_transfer", False) and hasattr(alloc, "_transfer"):
    how = "driver"
    def once(): alloc._transfer(db._buf, sb._buf, nbytes, src_dev=dev, dest_dev=dev)
  else:
    how = "kernel"
    def once(): dst.assign(src + 0.0).realize()
  once(); dev.synchronize()
  t = time.perf_counter()
  for _ in range(reps): once()
  dev.synchronize()
  return {"copy_gb_s": 2 * nbytes * reps / (time.perf_counter() - t) / 1e9, "copy_mib": nbytes // 2**20, "copy_by": how}

def decode_rates(stamps: list[float], lookahead: int) -> dict:
  """tok/s of the tokens stamped, timed in windows of `lookahead` tokens (they reach the host together)."""
  t = np.array(stamps)
  window = max(lookahead, 8)
  rates = [window / (t[i + window] - t[i]) for i in range(0, len(t) - window, window)] or [(len(t) - 1) / (t[-1] - t[0])]
  return {"tok_s": statistics.median(rates), "tok_s_mean": (len(t) - 1) / (t[-1] - t[0]), "tok_s_min": min(rates),
          "tok_s_max": max(rates), "tokens_timed": len(t)}

def check_ahead(eng, prompt: list[int], n: int = 40):
  """Decode with the next round's model step queued before the tokens are read (engine.decode's ahead, through
  hostio's asynchronous copies on CUDA), as generate and the server run it, against plain rounds on this device:
  the same greedy tokens, or the bench stops."""
  fast = list(generate(eng, prompt, n, lookahead=4))
  eng.reset()
  plain = [eng.prefill(0, prompt)]
  while len(plain) < n: plain += eng.decode([0], min(4, n - len(plain)))[:, 0].tolist()
  if fast != plain or not eng.ahead_used:
    raise OrinError(f"bench: decode with the next step queued ahead gave other tokens than plain decode ({eng.ahead_used} "
                    f"rounds started ahead): {fast} != {plain}")

def compile_prompt_len(chunk: int, context: int) -> int:
  """Tokens of the prompt that compiles the steps before the timings: a chunk and a few more (both chunk sizes), within
  a context that leaves room for the 4 tokens decoded after it (the context --prompt 32 --depth 0 allocates is shorter
  than a chunk of 512: that prompt did not fit)."""
  return min(chunk + 3, context - 5)

def bench_ours(eng, n_tokens: int, prompt_lens: list[int], depths: list[int], lookahead: int, temperature: float = 0.0) -> dict:
  from tinygrad.helpers import GlobalCounters
  gen = lambda prompt, n, *la: generate(eng, prompt, n, *la, temperature=temperature)
  rng = np.random.default_rng(0)
  vocab = eng.cfg.vocab_size
  tokens = lambda n: rng.integers(0, vocab, n).tolist()
  # compile: prefill (two chunk sizes) and decode, outside the timings
  t0 = time.monotonic()
  for _ in range(3):
    for _ in gen(tokens(compile_prompt_len(eng.chunk, eng.max_context)), 4, 2): pass
  compile_s = time.monotonic() - t0
  check_ahead(eng, tokens(16))
  # prefill: each prompt length from an empty cache, until the first token is on the host (best of 3)
  prefill = {}
  for n in prompt_lens:
    ttft = []
    for _ in range(3):
      prompt = tokens(n)
      t = time.perf_counter()
      next(iter(gen(prompt, 1)))
      ttft.append(time.perf_counter() - t)
    prefill[n] = min(ttft)
  # kernels and estimated bytes of one decode step
  for _ in gen(tokens(16), 2): pass
  eng.profile_step().realize()  # uncompiled, so that each kernel is counted (a graph counts as one)
  GlobalCounters.reset()
  eng.profile_step().realize()
  kernels, est_bytes = GlobalCounters.kernel_count, GlobalCounters.global_mem
  # decode at each depth: a prompt of `depth` tokens (16 at depth 0), WARM tokens, then n_tokens timed
  decode = {}
  for d in depths:
    stamps = [time.perf_counter() for _ in gen(tokens(max(d, 16)), n_tokens + WARM, lookahead)]
    decode[f"d{d}"] = decode_rates(stamps[WARM:], lookahead)
  first = decode[f"d{depths[0]}"]  # the flat decode figures of earlier runs: the shallowest depth
  nbytes = decode_bytes(eng)
  # effective bandwidth at each depth: the weights and the KV cache of the timed tokens' mean position, read per token,
  # as a share of a device copy's bandwidth measured here (issue 18)
  copy = copy_bandwidth(eng.device)
  for d, v in zip(depths, decode.values()):
    v["position"] = max(d, 16) + WARM + n_tokens / 2
    v["gb_s"] = (nbytes + kv_bytes(eng, v["position"])) * v["tok_s"] / 1e9
    v["copy_share"] = v["gb_s"] / copy["copy_gb_s"]
  return {"decode_tok_s": first["tok_s"], "decode_tok_s_mean": first["tok_s_mean"], "decode_tok_s_min": first["tok_s_min"],
          "decode_tok_s_max": first["tok_s_max"], "decode": decode, **{f"decode_{k}_tok_s": v["tok_s"] for k, v in decode.items()},
          "prefill_tokens": prompt_lens[0], "prefill_tok_s": prompt_lens[0] / prefill[prompt_lens[0]], "ttft_s": prefill[prompt_lens[0]],
          "prefill": {f"pp{n}": {"tok_s": n / t, "ttft_s": t} for n, t in prefill.items()}, "prefill_chunk": eng.chunk,
          "kernels_per_token": kernels, "bytes_per_token": nbytes, "tinygrad_est_bytes_per_token": est_bytes,
          "decode_gb_s": nbytes * first["tok_s"] / 1e9, **copy, "compile_s": compile_s, "load_s": eng.load_seconds,
          "tokens_timed": first["tokens_timed"]}

def bench_schema(eng, schema: dict, n_tokens: int, lookahead: int) -> dict:
  """Greedy decode constrained to a JSON schema (each answer generated until the grammar completes, repeated until
  n_tokens are timed) against free greedy decode of as many tokens after the same prompt. Rates count the tokens
  after each generation's first (the first comes from prefill), from the first token's arrival to the last's."""
  from orin_llm.chat import ChatTemplate
  from orin_llm.sampling import Sampling
  from orin_llm.structured import Grammars, json_grammar
  from orin_llm.tokenizer import Tokenizer
  tok = Tokenizer.from_metadata(eng.file.metadata)
  g = Grammars(tok, eng.cfg.vocab_size)
  grammar = json_grammar(schema, strict=True)
  text = ChatTemplate.from_metadata(eng.file.metadata).render([{"role": "user", "content": "Answer in JSON: " + json.dumps(schema)}])
  bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else None
  prompt = tok.encode(text, bos=False if bos and text.startswith(bos) else None)[:eng.max_context // 2]
  class Timed:  # the constraint, with the host's time in it (computing the mask, consuming the token)
    def __init__(self, c): self.c, self.host = c, 0.0
    def mask_words(self):
      t = time.perf_counter(); w = self.c.mask_words(); self.host += time.perf_counter() - t; return w
    def advance(self, tid):
      t = time.perf_counter(); d = self.c.advance(tid); self.host += time.perf_counter() - t; return d
  def run(constraint, max_new, stops):
    eng.reset()
    stamps = [time.perf_counter() for _ in eng.generate(prompt, max_new, Sampling(), stops, lookahead=lookahead, constraint=constraint)]
    return len(stamps) - 1, stamps[-1] - stamps[0]
  max_new = eng.max_context - len(prompt) - 1
  t0 = time.perf_counter()
  run(g.constraint(grammar), max_new, tok.stop_ids); run(None, 16, ())  # compile the masked steps; warm up
  first_s = time.perf_counter() - t0
  n, dt, host, answers, tokens, complete = 0, 0.0, 0.0, 0, [], 0
  while n < n_tokens:
    c = Timed(g.constraint(grammar))
    k, d = run(c, max_new, tok.stop_ids)
    if k < 1: raise OrinError("bench: the schema's answer is one token; give a schema with a longer answer")
    n, dt, host, answers, complete = n + k, dt + d, host + c.host, answers + 1, complete + c.c.done
    tokens.append(k + 1)
  k, d = run(None, n, ())
  return {"constrained_tok_s": n / dt, "free_tok_s": k / d, "ratio": (n / dt) / (k / d), "tokens_timed": n, "answers": answers,
          "complete_answers": complete, "tokens_per_answer": statistics.mean(tokens), "host_ms_per_token": host / (n + answers) * 1e3,
          "first_run_s": first_s}

def bench_llama(binary: str, model: str, n_tokens: int, prompt_lens: list[int], depths: list[int]) -> dict:
  cmd = [binary, "-m", model, "-ngl", "99", "-p", ",".join(map(str, prompt_lens)), "-n", str(n_tokens), "-fa", "0,1", "-r", "3", "-o", "json"]
  if depths != [0]: cmd[-4:-4] = ["-d", ",".join(map(str, depths))]  # -d: llama-bench's n_depth, context before each test
  log.info("running " + " ".join(cmd))
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode != 0: raise OrinError(f"llama-bench failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:] }")
  out, rows = {}, json.loads(r.stdout)
  for row in rows:  # every test at every depth; prefill at depth > 0 is kept but not compared (ours runs from depth 0)
    d = int(row.get("n_depth", 0))
    kind = f"decode_d{d}" if row["n_gen"] > 0 else f"pp{row['n_prompt']}" + (f"_d{d}" if d else "")
    out[f"{kind}_tok_s_fa{int(row['flash_attn'])}"] = row["avg_ts"]
  out["build"] = rows[0].get("build_commit", "?") if rows else "?"
  return out

def ours_of(ours: dict, key: str) -> float | None:
  """Our figure for a llama.cpp key: decode_d<D>_tok_s_fa<F>, pp<N>_tok_s_fa<F>."""
  kind = key.rsplit("_tok_s_fa", 1)[0]
  if kind.startswith("decode_"): return ours["decode"].get(kind[len("decode_"):], {}).get("tok_s")
  return ours["prefill"].get(kind, {}).get("tok_s")

def cmd_bench(args):
  if not 0.0 <= args.temperature <= 2.0:  # the server's bound on a request's temperature (NaN fails it too)
    raise OrinError(f"--temperature {args.temperature}: give a number in 0..2")
  settings.apply(beam=args.beam)
  settings.search_defaults()  # the server's BEAM search settings (forkserver workers, bounds), where unset
  model = settings.model_path(args)
  from orin_llm.engine import Engine, DEFAULT_LOOKAHEAD
  def ints(v, flag, default):
    try: return [int(n) for n in v.split(",")] if v else list(default)
    except ValueError: raise OrinError(f"{flag} {v!r}: give comma-separated integers") from None
  prompt_lens, depths = ints(args.prompt, "--prompt", DEFAULT_PROMPTS), ints(args.depth, "--depth", DEFAULT_DEPTHS)
  device = settings.open_device()
  # the model's own context may be shorter: the engine allocates the lesser; a schema's prompt holds the schema,
  # and its answers must fit beside it
  need = max(max(prompt_lens) + 1, max(max(depths), 16) + args.tokens + WARM, 2048 if args.json_schema else 0)
  from orin_llm.server.config import ServerConfig
  eng = Engine(model, max_context=args.context or need + 64, device=device, max_batch=args.max_batch or ServerConfig.max_batch,
               prefill_copy_mb=ServerConfig.prefill_copy_mb if args.prefill_copy_mb is None else args.prefill_copy_mb)
  ctx = eng.max_context
  prompt_lens = fit(prompt_lens, ctx - 1, ctx, args.prompt is not None, "prefill lengths", "--prompt")  # room for the next token
  depths = fit(depths, ctx - args.tokens - WARM, ctx, args.depth is not None, "decode depths", "--depth")
  ours = bench_ours(eng, args.tokens, prompt_lens, depths, args.lookahead or DEFAULT_LOOKAHEAD, args.temperature)
  res = {"model": str(model), "device": device, "beam": settings.beam_width(), "prefill_copy_mib": round(eng.dense_bytes / 2**20), "ours": ours, "prompt": prompt_lens, "depth": depths,
         "temperature": args.temperature,
         "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
  if args.json_schema:
    try: schema = json.loads(open(args.json_schema).read())
    except (OSError, ValueError) as e: raise OrinError(f"--json-schema {args.json_schema}: {e}") from None
    res["schema"] = {"file": args.json_schema, **bench_schema(eng, schema, args.tokens, args.lookahead or DEFAULT_LOOKAHEAD)}
  binary = args.llama_bench or shutil.which("llama-bench")
  if binary:
    ll = bench_llama(binary, str(model), args.tokens, prompt_lens, depths)
    res["llama_cpp"] = ll
    res["ratio"] = {k: o / v for k, v in ll.items() if k[-4:] in ("_fa0", "_fa1") and (o := ours_of(ours, k))}
  print_table(res)
  if args.json:
    with open(args.json, "w") as f: json.dump(res, f, indent=1)

def print_table(res: dict):
  o, ll, r = res["ours"], res.get("llama_cpp", {}), res.get("ratio", {})
  def vs(kind: str) -> str:  # llama.cpp's figure and our ratio to it, flash attention off and on
    return "   ".join(f"llama.cpp fa{fa} {ll[k]:.1f} ({r[k]:.2f}x)" for fa in (0, 1) if (k := f"{kind}_tok_s_fa{fa}") in ll and k in r)
  rows = [*[(f"decode tok/s, depth {k[1:]}", f"{v['tok_s']:.1f} [{v['tok_s_min']:.1f}, {v['tok_s_max']:.1f}]", vs(f"decode_{k}"))
            for k, v in o["decode"].items()],
          *[(f"prefill tok/s, {k}", f"{v['tok_s']:.0f} (first token {v['ttft_s'] * 1e3:.1f} ms)", vs(k)) for k, v in o["prefill"].items()],
          ("decode GB/s", f"{o['decode_gb_s']:.0f} ({o['bytes_per_token'] / 2**20:.0f} MiB of weights per token, depth {res['depth'][0]})", ""),
          *([("decode GB/s, with the KV cache", " / ".join(f"{v['gb_s']:.0f}" for v in o["decode"].values())
              + f" at depths {' / '.join(k[1:] for k in o['decode'])}",
              " / ".join(f"{100 * v['copy_share']:.0f}%" for v in o["decode"].values())
              + f" of a {o['copy_mib']} MiB device copy's {o['copy_gb_s']:.0f} GB/s (read + written, {o['copy_by']})")]
            if "copy_gb_s" in o else []),
          ("kernels per token", str(o["kernels_per_token"]), ""),
          ("load / compile", f"{o['load_s']:.1f} s / {o['compile_s']:.1f} s; prefill in chunks of {o['prefill_chunk']}", "")]
  if (sc := res.get("schema")) is not None:
    rows.append(("decode tok/s, JSON schema", f"{sc['constrained_tok_s']:.1f} vs {sc['free_tok_s']:.1f} free = {sc['ratio']:.3f}x",
                 f"{sc['answers']} answers ({sc['complete_answers']} complete) of {sc['tokens_per_answer']:.0f} tokens; "
                 f"host {sc['host_ms_per_token']:.2f} ms a token in the grammar"))
  w, w2 = max(len(a) for a, _, _ in rows), max((len(b) for _, b, c in rows if c), default=0)
  print(f"orin-llm bench: {os.path.basename(res['model'])} on {res['device']} (BEAM={res['beam']}"
        + (f", sampled at temperature {res['temperature']:g})" if res.get("temperature", 0) > 0 else ")")
        + (f", llama.cpp {ll['build']}" if ll else ""))
  for a, b, c in rows: print(f"  {a:<{w}}  {b:<{w2}}   {c}".rstrip())
