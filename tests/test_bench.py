"""`orin-llm bench` runs end to end on a small model and writes the figures it prints (CPU: no speed asserted)."""
import json, os, subprocess, sys
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB

def bench(*args):
  return subprocess.run([sys.executable, "-m", "orin_llm", "bench", *map(str, args), "--llama-bench", ""], capture_output=True, text=True,
                        timeout=600, env={**os.environ, "DEV": "CPU"})

def test_bench_writes_json(tmp_path):
  """With its default prompt lengths (512, 2048) on a model whose context is shorter (256 here, to keep the test
  quick; 2048 is the case met in practice): clipped to the context, with a note."""
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1, context_length=256), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  out = tmp_path / "bench.json"
  r = bench("--model", model, "--tokens", "16", "--json", out)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "the context holds 256 tokens: prefill lengths 255 instead of 512,2048" in r.stderr, r.stderr
  res = json.loads(out.read_text())
  o = res["ours"]
  assert o["decode_tok_s"] > 0 and o["prefill_tok_s"] > 0 and o["kernels_per_token"] > 10
  assert set(o["prefill"]) == {"pp255"}
  from orin_llm.gguf_file import GGUFFile
  tensor_bytes = sum(t.nbytes for t in GGUFFile(model).tensors.values())
  assert 0.95 * tensor_bytes < o["bytes_per_token"] < 1.1 * tensor_bytes  # every weight once; the tied embedding read whole
  assert "decode tok/s" in r.stdout and "kernels per token" in r.stdout

def test_bench_prompt_longer_than_context(tmp_path):
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  r = bench("--model", model, "--prompt", "40,3000")
  assert r.returncode == 2 and "Traceback" not in r.stderr and "error: --prompt 3000: the context holds 2048" in r.stderr, r.stderr
