"""Where a constrained token's extra time goes (GPU): free decode at lookahead 8 and 1, the masked steps under an
allow-all mask (no grammar), and a JSON schema, over the same positions; then the host time of each phase of the
constrained loop. python3 scripts/structured_overhead.py MODEL [SCHEMA] [TOKENS]"""
import json, sys, time
import numpy as np
from orin_llm.engine import Engine
from orin_llm.sampling import Sampling
from orin_llm.structured import AllowAll, Grammars, json_grammar
from orin_llm.tokenizer import Tokenizer

model = sys.argv[1]
schema = json.load(open(sys.argv[2] if len(sys.argv) > 2 else "scripts/bench-schema.json"))
n = int(sys.argv[3]) if len(sys.argv) > 3 else 512
eng = Engine(model, max_context=2048)
tok = Tokenizer.from_metadata(eng.file.metadata)
g = Grammars(tok, eng.cfg.vocab_size)
grammar = json_grammar(schema)
prompt = tok.encode("Answer in JSON: " + json.dumps(schema))

def rate(constraint=None, lookahead=8, max_new=n):
  eng.cached = []
  stamps = [time.perf_counter() for _ in eng.generate(prompt, max_new, Sampling(), (), lookahead=lookahead, constraint=constraint)]
  return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)

for _ in range(2): rate(); rate(lookahead=1); rate(AllowAll(eng.cfg.vocab_size)); rate(g.constraint(grammar))  # compile, warm
k = rate(g.constraint(grammar))[1]  # the schema's answer length: the others run as many tokens
res = {"tokens": k, "free_la8": rate(max_new=k)[0], "free_la1": rate(lookahead=1, max_new=k)[0],
       "allow_all": rate(AllowAll(eng.cfg.vocab_size), max_new=k)[0], "schema": rate(g.constraint(grammar))[0]}
# phases of the constrained loop: host time inside each call (a read waits for the device)
phases = {}
def timed(name, fn):
  def f(*a, **kw):
    t = time.perf_counter(); r = fn(*a, **kw); phases[name] = phases.get(name, 0.0) + time.perf_counter() - t; return r
  return f
eng._read_token, eng._set_mask = timed("read (waits for the device)", eng._read_token), timed("mask upload", eng._set_mask)
if (pipe := eng._token_pipe()) is not None:  # CUDA: the pipelined loop's copies and its wait for the token
  pipe.upload, pipe.fetch, pipe.wait = timed("mask upload", pipe.upload), timed("queue token copy", pipe.fetch), timed("wait for the token", pipe.wait)
eng._jits[("decode", None)] = timed("queue decode", eng._jits[("decode", None)])
eng._jits[("choose_masked", True)] = timed("queue masked choice", eng._jits[("choose_masked", True)])
c = g.constraint(grammar)
c.mask_words, c.advance = timed("grammar: mask", c.mask_words), timed("grammar: advance", c.advance)
r, k2 = rate(c)
res["schema_instrumented"] = r
res["ms_per_token"] = {p: v / k2 * 1e3 for p, v in phases.items()}
print(json.dumps(res, indent=1))
