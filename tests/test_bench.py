"""`orin-llm bench` runs end to end on a small model and writes the figures it prints (CPU: no speed asserted)."""
import json, os, subprocess, sys
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB

def test_bench_writes_json(tmp_path):
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  out, schema = tmp_path / "bench.json", tmp_path / "schema.json"
  schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                                "required": ["ok", "n"]}))
  r = subprocess.run([sys.executable, "-m", "orin_llm", "bench", "--model", model, "--tokens", "16", "--prompt", "40",
                      "--llama-bench", "", "--json", out, "--json-schema", schema], capture_output=True, text=True, timeout=600, env={**os.environ, "DEV": "CPU"})
  assert r.returncode == 0, r.stderr[-3000:]
  res = json.loads(out.read_text())
  o = res["ours"]
  assert o["decode_tok_s"] > 0 and o["prefill_tok_s"] > 0 and o["kernels_per_token"] > 10
  from orin_llm.gguf_file import GGUFFile
  tensor_bytes = sum(t.nbytes for t in GGUFFile(model).tensors.values())
  assert 0.95 * tensor_bytes < o["bytes_per_token"] < 1.1 * tensor_bytes  # every weight once; the tied embedding read whole
  assert "decode tok/s" in r.stdout and "kernels per token" in r.stdout
  sc = res["schema"]  # decode under a JSON schema against free decode, same engine
  assert sc["tokens_timed"] >= 16 and sc["complete_answers"] >= 1 and sc["constrained_tok_s"] > 0 and sc["ratio"] > 0
  assert "decode tok/s, JSON schema" in r.stdout
