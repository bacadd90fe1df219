"""`orin-llm bench`: decode and prefill speed of our engine, and of llama.cpp's llama-bench on the
same file in the same invocation, with the ratio ours / llama.cpp for each figure."""
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
  p.add_argument("--prompt", default=None, help="prefill lengths, comma-separated (default 512,2048, clipped to the context)")
  p.add_argument("--lookahead", type=int, default=None, help="decode steps queued before the host reads tokens (default: the engine's, as served)")
  p.add_argument("--context", type=int, default=None, help="context to allocate (default: longest prompt + tokens + 64)")
  p.set_defaults(fn=cmd_bench)

DEFAULT_PROMPTS = (512, 2048)

def fit_prompts(lens: list[int], context: int, given: bool) -> list[int]:
  """Prompt lengths that leave the context room for the token after the prompt: lengths the user gave must,
  the defaults are clipped to it with a note (a model of context 2048 gets 512 and 2047)."""
  if given:
    if max(lens) >= context:
      raise OrinError(f"--prompt {max(lens)}: the context holds {context} tokens (a prompt and the token after it); "
                      "give shorter prompts or a longer --context (the model's own is the most)")
    return lens
  fit = sorted({min(n, context - 1) for n in lens})
  if fit != lens:
    log.info(f"bench: the context holds {context} tokens: prefill lengths {','.join(map(str, fit))} instead of "
             f"{','.join(map(str, lens))} (--prompt and --context choose others)")
  return fit

def decode_bytes(eng) -> int:
  """Bytes one decode step must read: every weight plane once, except the embedding table, of which
  only a row is read (unless the output head is tied to it and reads it whole)."""
  total = 0
  for name, w in eng.weights.items():
    if name == "token_embd.weight" and not eng.cfg.tied_output: continue
    total += w.nbytes()
  return total

def bench_ours(eng, n_tokens: int, prompt_lens: list[int], lookahead: int) -> dict:
  from tinygrad.helpers import GlobalCounters
  from orin_llm.sampling import Sampling
  rng = np.random.default_rng(0)
  vocab = eng.cfg.vocab_size
  greedy = Sampling()
  # compile: prefill (two chunk sizes) and decode, outside the timings
  t0 = time.monotonic()
  for _ in range(3):
    eng.reset()
    for _ in eng.generate(rng.integers(0, vocab, eng.chunk + 3).tolist(), 4, greedy, lookahead=2): pass
  compile_s = time.monotonic() - t0
  # prefill: each prompt length from an empty cache, until the first token is on the host (best of 3)
  prefill = {}
  for n in prompt_lens:
    ttft = []
    for _ in range(3):
      eng.reset()
      prompt = rng.integers(0, vocab, n).tolist()
      t = time.perf_counter()
      next(iter(eng.generate(prompt, 1, greedy)))
      ttft.append(time.perf_counter() - t)
    prefill[n] = min(ttft)
  # kernels and estimated bytes of one decode step
  eng.reset()
  prompt = rng.integers(0, vocab, 16).tolist()
  for _ in eng.generate(prompt, 2, greedy): pass
  eng.profile_step().realize()  # uncompiled, so that each kernel is counted (a graph counts as one)
  GlobalCounters.reset()
  eng.profile_step().realize()
  kernels, est_bytes = GlobalCounters.kernel_count, GlobalCounters.global_mem
  # decode: n_tokens after a warm-up, timed in windows of `lookahead` tokens
  eng.reset()
  stamps = []
  gen = eng.generate(rng.integers(0, vocab, 16).tolist(), n_tokens + 32, greedy, lookahead=lookahead)
  for i, _ in enumerate(gen): stamps.append(time.perf_counter())
  stamps = np.array(stamps[32:])  # the first 32 tokens warm up
  window = max(lookahead, 8)
  rates = [window / (stamps[i + window] - stamps[i]) for i in range(0, len(stamps) - window, window)]
  total = (len(stamps) - 1) / (stamps[-1] - stamps[0])
  nbytes = decode_bytes(eng)
  return {"decode_tok_s": statistics.median(rates), "decode_tok_s_mean": total, "decode_tok_s_min": min(rates),
          "decode_tok_s_max": max(rates), "prefill_tokens": prompt_lens[0],
          "prefill_tok_s": prompt_lens[0] / prefill[prompt_lens[0]], "ttft_s": prefill[prompt_lens[0]],
          "prefill": {f"pp{n}": {"tok_s": n / t, "ttft_s": t} for n, t in prefill.items()}, "prefill_chunk": eng.chunk, "kernels_per_token": kernels, "bytes_per_token": nbytes, "tinygrad_est_bytes_per_token": est_bytes,
          "decode_gb_s": nbytes * statistics.median(rates) / 1e9, "compile_s": compile_s, "load_s": eng.load_seconds,
          "tokens_timed": len(stamps)}

def bench_llama(binary: str, model: str, n_tokens: int, prompt_lens: list[int]) -> dict:
  cmd = [binary, "-m", model, "-ngl", "99", "-p", ",".join(map(str, prompt_lens)), "-n", str(n_tokens), "-fa", "0,1", "-r", "3", "-o", "json"]
  log.info("running " + " ".join(cmd))
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode != 0: raise OrinError(f"llama-bench failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:] }")
  out = {}
  for row in json.loads(r.stdout):
    kind = "decode" if row["n_gen"] > 0 else f"pp{row['n_prompt']}"
    out[f"{kind}_tok_s_fa{int(row['flash_attn'])}"] = row["avg_ts"]
  out["build"] = f"{r.stdout and json.loads(r.stdout)[0].get('build_commit', '?')}"
  return out

def cmd_bench(args):
  settings.apply(beam=args.beam)
  model = settings.model_path(args)
  from orin_llm.engine import Engine
  try: prompt_lens = [int(n) for n in args.prompt.split(",")] if args.prompt else list(DEFAULT_PROMPTS)
  except ValueError: raise OrinError(f"--prompt {args.prompt!r}: give prompt lengths as comma-separated integers") from None
  device = settings.open_device()
  # the model's own context may be shorter: the engine allocates the lesser
  eng = Engine(model, max_context=args.context or max(prompt_lens) + args.tokens + 64, device=device)
  prompt_lens = fit_prompts(prompt_lens, eng.max_context, given=args.prompt is not None)
  from orin_llm.engine import DEFAULT_LOOKAHEAD
  ours = bench_ours(eng, args.tokens, prompt_lens, args.lookahead or DEFAULT_LOOKAHEAD)
  res = {"model": str(model), "device": device, "beam": settings.beam_width(), "ours": ours,
         "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
  binary = args.llama_bench or shutil.which("llama-bench")
  if binary:
    ll = bench_llama(binary, str(model), args.tokens, prompt_lens)
    res["llama_cpp"] = ll
    ours_of = lambda k: ours["decode_tok_s"] if k.startswith("decode") else ours["prefill"].get(k.split("_")[0], {}).get("tok_s")
    res["ratio"] = {k: ours_of(k) / v for k, v in ll.items() if k.endswith(("fa0", "fa1")) and ours_of(k)}
  print_table(res)
  if args.json:
    with open(args.json, "w") as f: json.dump(res, f, indent=1)

def print_table(res: dict):
  o = res["ours"]
  rows = [("decode tok/s (median)", f"{o['decode_tok_s']:.1f}  [min {o['decode_tok_s_min']:.1f}, max {o['decode_tok_s_max']:.1f}, mean {o['decode_tok_s_mean']:.1f}]"),
          ("decode GB/s", f"{o['decode_gb_s']:.0f} ({o['bytes_per_token'] / 2**20:.0f} MiB per token)"),
          ("kernels per token", str(o["kernels_per_token"])),
          *[(f"prefill tok/s ({k})", f"{v['tok_s']:.0f}  (first token after {v['ttft_s'] * 1e3:.1f} ms; chunks of {o['prefill_chunk']})")
            for k, v in o["prefill"].items()],
          ("load / compile", f"{o['load_s']:.1f} s / {o['compile_s']:.1f} s")]
  if "llama_cpp" in res:
    ll, r = res["llama_cpp"], res["ratio"]
    for k in sorted(r): rows.append((f"llama.cpp {k.replace('_tok_s', '')}", f"{ll[k]:.1f} tok/s   ours/llama.cpp = {r[k]:.2f}x"))
  w = max(len(a) for a, _ in rows)
  print(f"orin-llm bench: {os.path.basename(res['model'])} on {res['device']} (BEAM={res['beam']})")
  for a, b in rows: print(f"  {a:<{w}}  {b}")
