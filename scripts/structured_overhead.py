"""Where a constrained token's extra time goes (GPU): free decode at lookahead 8 and 1, the masked steps under an
allow-all mask (no grammar), and a JSON schema, over the same positions; then the host time of each phase of the
constrained loop. python3 scripts/structured_overhead.py MODEL [SCHEMA] [TOKENS]"""
import json, sys, time
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
  eng.reset()
  stamps = [time.perf_counter() for _ in eng.generate(prompt, max_new, Sampling(), (), lookahead=lookahead, constraint=constraint)]
  return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)

for _ in range(2): rate(); rate(lookahead=1); rate(AllowAll(eng.cfg.vocab_size)); rate(g.constraint(grammar))  # compile, warm
k = rate(g.constraint(grammar))[1]  # the schema's answer length: the others run as many tokens
res = {"tokens": k, "free_la8": rate(max_new=k)[0], "free_la1": rate(lookahead=1, max_new=k)[0],
       "allow_all": rate(AllowAll(eng.cfg.vocab_size), max_new=k)[0], "schema": rate(g.constraint(grammar))[0]}
phases = {}  # host time inside each call of the constrained loop (decode's includes reading the token: it waits)
def timed(name, fn):
  def f(*a, **kw):
    t = time.perf_counter(); r = fn(*a, **kw); phases[name] = phases.get(name, 0.0) + time.perf_counter() - t; return r
  return f
eng.set_mask = timed("mask upload", eng.set_mask)
decode = eng.decode
eng.decode = timed("decode (queue, mask, choice, wait, read)", decode)
c = g.constraint(grammar)
c.mask_words, c.advance = timed("grammar: mask", c.mask_words), timed("grammar: advance", c.advance)
r, k2 = rate(c)
res["schema_instrumented"] = r
res["ms_per_token"] = {p: v / k2 * 1e3 for p, v in phases.items()}
print(json.dumps(res, indent=1))
