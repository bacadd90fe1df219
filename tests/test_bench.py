"""`orin-llm bench` runs end to end on a small model and writes the figures it prints (CPU: no speed asserted),
side by side with a stand-in llama-bench that prints what llama-bench -o json prints."""
import json, os, subprocess, sys
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB

FAKE_LLAMA_BENCH = '''
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
open(sys.argv[0] + ".args", "w").write(" ".join(sys.argv[1:]))
rows = [{"build_commit": "fake", "n_prompt": p, "n_gen": g, "n_depth": d, "flash_attn": bool(fa), "avg_ts": 100.0 + d + p + fa}
        for fa in map(int, a["-fa"].split(",")) for p, g in [*[(int(p), 0) for p in a["-p"].split(",")], (0, int(a["-n"]))]
        for d in map(int, a.get("-d", "0").split(","))]
print(json.dumps(rows))
'''

def bench(*args, llama_bench=""):
  return subprocess.run([sys.executable, "-m", "orin_llm", "bench", *map(str, args), "--llama-bench", llama_bench], capture_output=True,
                        text=True, timeout=600, env={**os.environ, "DEV": "CPU"})

def test_bench_writes_json(tmp_path):
  """With its default prompt lengths (32, 512, 2048) and depths (0, 1024, 4096) on a model whose context is shorter
  (256 here, to keep the test quick; 2048 is the case met in practice): clipped to the context, with a note."""
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1, context_length=256), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  out, fake = tmp_path / "bench.json", tmp_path / "llama-bench"
  fake.write_text(f"#!{sys.executable}\n" + FAKE_LLAMA_BENCH); fake.chmod(0o755)
  r = bench("--model", model, "--tokens", "16", "--json", out, llama_bench=fake)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "the context holds 256 tokens: prefill lengths 32,255 instead of 32,512,2048" in r.stderr, r.stderr
  assert "the context holds 256 tokens: decode depths 0,208 instead of 0,1024,4096" in r.stderr, r.stderr  # 256 - 16 timed - 32 warm-up
  res = json.loads(out.read_text())
  o = res["ours"]
  assert res["prompt"] == [32, 255] and res["depth"] == [0, 208] and set(o["prefill"]) == {"pp32", "pp255"}
  assert o["decode_tok_s"] > 0 and o["decode_d208_tok_s"] > 0 and o["decode"]["d208"]["tokens_timed"] == 16 and o["kernels_per_token"] > 10
  from orin_llm.gguf_file import GGUFFile
  tensor_bytes = sum(t.nbytes for t in GGUFFile(model).tensors.values())
  assert 0.95 * tensor_bytes < o["bytes_per_token"] < 1.1 * tensor_bytes  # every weight once; the tied embedding read whole
  # effective bandwidth: weights and the KV cache at the timed tokens' mean position, read per token
  assert o["copy_gb_s"] > 0 and o["copy_mib"] == 64 and o["copy_by"] in ("driver", "kernel")
  shape = preset("tiny-llama", n_layers=1, context_length=256)
  for d, v in o["decode"].items():
    assert v["position"] == max(int(d[1:]), 16) + 32 + 16 / 2  # the prompt, the warm-up, half the timed tokens
    kv = shape.n_layers * 2 * shape.n_kv_heads * shape.head_dim * 2 * v["position"]  # float16 keys and values
    assert abs(v["gb_s"] - (o["bytes_per_token"] + kv) * v["tok_s"] / 1e9) < 1e-9 * v["gb_s"]
    assert abs(v["copy_share"] - v["gb_s"] / o["copy_gb_s"]) < 1e-12
  assert o["decode"]["d208"]["gb_s"] / o["decode"]["d208"]["tok_s"] > o["decode"]["d0"]["gb_s"] / o["decode"]["d0"]["tok_s"]
  assert "decode GB/s, with the KV cache" in r.stdout and "MiB device copy" in r.stdout
  assert "-p 32,255 -n 16 -fa 0,1 -d 0,208 -r 3" in (tmp_path / "llama-bench.args").read_text()
  ll, ratio = res["llama_cpp"], res["ratio"]
  assert ll["decode_d208_tok_s_fa1"] == 309.0 and ll["pp255_d208_tok_s_fa0"] == 563.0
  # one ratio per depth and per prompt length, flash attention off and on; none for llama.cpp's prefill at depth
  assert sorted(ratio) == sorted(f"{k}_tok_s_fa{fa}" for k in ("decode_d0", "decode_d208", "pp32", "pp255") for fa in (0, 1))
  assert abs(ratio["decode_d208_tok_s_fa1"] - o["decode_d208_tok_s"] / 309.0) < 1e-9
  assert "decode tok/s, depth 208" in r.stdout and "llama.cpp fa1" in r.stdout and "kernels per token" in r.stdout

def test_bench_sampled(tmp_path):
  """--temperature: prefill and decode choose their tokens by sampling (the server's requests default to 1.0), the
  figures say so."""
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1, context_length=256), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  out = tmp_path / "bench.json"
  r = bench("--model", model, "--tokens", "8", "--prompt", "32", "--depth", "0", "--temperature", "0.9", "--json", out)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "compiling the choose-one-sampled step" in r.stderr and "sampled at temperature 0.9" in r.stdout, (r.stderr[-2000:], r.stdout)
  res = json.loads(out.read_text())
  assert res["temperature"] == 0.9 and res["ours"]["decode"]["d0"]["tokens_timed"] == 8

@pytest.mark.parametrize("t", ["-0.5", "nan", "2.5"])
def test_bench_temperature_out_of_range(tmp_path, t):
  r = bench("--model", tmp_path / "absent.gguf", "--temperature", t)
  assert r.returncode == 2 and "Traceback" not in r.stderr and f"--temperature {float(t)}: give a number in 0..2" in r.stderr, r.stderr

def test_bench_lengths_longer_than_context(tmp_path):
  """Lengths the user gives are not clipped: one that does not fit is an error."""
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  r = bench("--model", model, "--prompt", "40,3000")
  assert r.returncode == 2 and "Traceback" not in r.stderr and "error: --prompt 3000: the context holds 2048" in r.stderr, r.stderr
  r = bench("--model", model, "--prompt", "40", "--depth", "0,2040")
  assert r.returncode == 2 and "Traceback" not in r.stderr and "error: --depth 2040: the context holds 2048" in r.stderr, r.stderr

def test_bench_json_schema(tmp_path):
  """--json-schema: decode constrained to a schema against free decode after the same prompt, same engine."""
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  out, schema = tmp_path / "bench.json", tmp_path / "schema.json"
  schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                                "required": ["ok", "n"]}))
  r = bench("--model", model, "--tokens", "16", "--prompt", "32", "--depth", "0", "--json", out, "--json-schema", schema)
  assert r.returncode == 0, r.stderr[-3000:]
  sc = json.loads(out.read_text())["schema"]
  assert sc["tokens_timed"] >= 16 and sc["complete_answers"] >= 1 and sc["constrained_tok_s"] > 0 and sc["ratio"] > 0
  assert "decode tok/s, JSON schema" in r.stdout

def test_compile_prompt_fits_the_context():
  """The prompt that compiles the steps fits a context shorter than a chunk (the one --prompt 32 --depth 0 allocates)."""
  from orin_llm.bench import compile_prompt_len
  assert compile_prompt_len(512, 4096) == 515  # a chunk and a few: both chunk sizes
  assert compile_prompt_len(512, 240) + 4 < 240 and compile_prompt_len(16, 128) == 19
