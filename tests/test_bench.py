"""`orin-llm bench` runs end to end on a small model and writes the figures it prints (CPU: no speed asserted),
side by side with a stand-in llama-bench that prints what llama-bench -o json prints."""
import json, os, subprocess, sys
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from orin_llm.bench import clip
from conftest import LLAMA_VOCAB

FAKE_LLAMA_BENCH = '''#!/usr/bin/env python3
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
open(sys.argv[0] + ".args", "w").write(" ".join(sys.argv[1:]))
rows = [{"build_commit": "fake", "n_prompt": p, "n_gen": g, "n_depth": d, "flash_attn": bool(fa), "avg_ts": 100.0 + d + p + fa}
        for fa in map(int, a["-fa"].split(",")) for p, g in [*[(int(p), 0) for p in a["-p"].split(",")], (0, int(a["-n"]))]
        for d in map(int, a.get("-d", "0").split(","))]
print(json.dumps(rows))
'''

def test_clip():
  assert clip([32, 512, 2048], 2047, "--prompt") == [32, 512, 2047]
  assert clip([0, 1024, 4096, 8192], 1888, "--depth") == [0, 1024, 1888]
  assert clip([512, 32], 4096, "--prompt") == [32, 512]

def test_bench_writes_json(tmp_path):
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1, context_length=128), QT.Q6_K, LLAMA_VOCAB, vocab_size=512)
  out, fake = tmp_path / "bench.json", tmp_path / "llama-bench"
  fake.write_text(FAKE_LLAMA_BENCH); fake.chmod(0o755)
  # depth 100 and prompt 200 are past the model's 128 tokens of context: clipped
  r = subprocess.run([sys.executable, "-m", "orin_llm", "bench", "--model", model, "--tokens", "16", "--prompt", "8,200", "--depth", "0,100",
                      "--llama-bench", fake, "--json", out], capture_output=True, text=True, timeout=600, env={**os.environ, "DEV": "CPU"})
  assert r.returncode == 0, r.stderr[-3000:]
  res = json.loads(out.read_text())
  o = res["ours"]
  assert res["prompt"] == [8, 127] and res["depth"] == [0, 80] and "clipped" in r.stderr
  assert o["decode_tok_s"] > 0 and o["decode_d80_tok_s"] > 0 and o["decode"]["d80"]["tokens_timed"] == 16
  assert o["prefill"]["pp127"]["tok_s"] > 0 and o["kernels_per_token"] > 10
  from orin_llm.gguf_file import GGUFFile
  tensor_bytes = sum(t.nbytes for t in GGUFFile(model).tensors.values())
  assert 0.95 * tensor_bytes < o["bytes_per_token"] < 1.1 * tensor_bytes  # every weight once; the tied embedding read whole
  assert "-p 8,127 -n 16 -fa 0,1 -d 0,80 -r 3" in (tmp_path / "llama-bench.args").read_text()
  ll, ratio = res["llama_cpp"], res["ratio"]
  assert ll["decode_d80_tok_s_fa1"] == 181.0 and ll["pp127_d80_tok_s_fa0"] == 307.0
  # one ratio per depth and per prompt length, flash attention off and on; none for llama.cpp's prefill at depth
  assert sorted(ratio) == sorted(f"{k}_tok_s_fa{fa}" for k in ("decode_d0", "decode_d80", "pp8", "pp127") for fa in (0, 1))
  assert abs(ratio["decode_d80_tok_s_fa1"] - o["decode_d80_tok_s"] / 181.0) < 1e-9
  assert "decode tok/s, depth 80" in r.stdout and "llama.cpp fa1" in r.stdout and "kernels per token" in r.stdout
