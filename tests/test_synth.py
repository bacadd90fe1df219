"""`orin-llm synth`: the presets have the public models' shapes; float files (what llama-quantize takes)
and files in llama-quantize's Q4_K_M mix parse with gguf's own reader and run in the engine."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from dataclasses import replace
from orin_llm.synth import PRESETS, write_model, preset, llama_quantize_types
from reference import Reference
from conftest import LLAMA_VOCAB, QWEN_VOCAB

def test_presets_have_the_public_parameter_counts():
  # total / without embedding and output head, in billions (the model cards')
  want = {"llama-3.2-1b": (1.24, 0.97), "llama-3.2-3b": (3.21, 2.82), "llama-3.1-8b": (8.03, 6.98),
          "qwen3-0.6b": (0.60, 0.44), "qwen3-1.7b": (1.72, 1.41)}
  for name, (total, body) in want.items():
    s = PRESETS[name]
    vocab = 151936 if s.arch == "qwen3" else 128256
    n = sum(int(np.prod(x)) for x in replace(s, vocab_size=vocab).tensor_shapes().values())
    embd = vocab * s.dim * (1 if s.tied_output else 2)
    assert (round(n / 1e9, 2), round((n - embd) / 1e9, 2)) == (total, body), name

def test_q4_k_m_mix_is_llama_quantizes():
  main, types = llama_quantize_types(PRESETS["llama-3.2-1b"], "Q4_K_M")
  assert main == QT.Q4_K and types["token_embd.weight"] == QT.Q6_K  # tied: the embedding is the output head
  assert sorted(int(n.split(".")[1]) for n in types if n.endswith("attn_v.weight")) == [0, 1, 4, 7, 10, 13, 14, 15]
  assert {n.replace("attn_v", "ffn_down") for n in types if "attn_v" in n} == {n for n in types if "ffn_down" in n}
  assert llama_quantize_types(PRESETS["llama-3.1-8b"], "Q4_K_M")[1]["output.weight"] == QT.Q6_K
  assert llama_quantize_types(PRESETS["qwen3-0.6b"], "Q8_0") == (QT.Q8_0, {})

@pytest.mark.parametrize("pre,kind", [("tiny-llama", "F16"), ("tiny-qwen3", "BF16"), ("tiny-llama", "Q4_K_M")])
def test_written_model_runs(tmp_path, rng, pre, kind):
  from orin_llm.engine import Engine
  s = preset(pre)
  qt, types = llama_quantize_types(s, kind) if kind == "Q4_K_M" else (QT[kind], {})
  path = write_model(tmp_path / "m.gguf", s, qt, QWEN_VOCAB if pre.endswith("qwen3") else LLAMA_VOCAB,
                     seed=int(rng.integers(1 << 30)), types=types, vocab_size=2048)
  ref = Reference(path)  # gguf.GGUFReader reads the file
  got = {t.name: (tuple(int(x) for x in reversed(t.shape)), t.tensor_type) for t in gguf.GGUFReader(path).tensors}
  assert got == {name: (shp, QT.F32 if len(shp) == 1 else types.get(name, qt)) for name, shp in replace(s, vocab_size=2048).tensor_shapes().items()}
  if kind != "Q4_K_M":
    w = ref.w["blk.0.ffn_down.weight"]  # weights of the chosen spread: 0.5 / sqrt(columns)
    assert abs(w.std() * np.sqrt(w.shape[1]) / 0.5 - 1) < 0.05 and abs(w.mean()) < 0.1 * w.std()
  eng = Engine(path, max_context=64, chunk=8)
  prompt = rng.integers(0, 2048, 9).tolist()
  for t in prompt[:-1]: ref.step(t)
  want = ref.step(prompt[-1])
  got = eng.forward(prompt, 0)
  assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
  assert len(list(eng.generate(prompt, 4))) == 4

def test_make_models_script(tmp_path):
  """scripts/make_models.sh with a stand-in llama-quantize (copies its input): F16 file, quantized file,
  skip when present, F16 removed after its last use."""
  import os, subprocess, sys
  from conftest import ROOT
  fake = tmp_path / "llama-quantize"
  fake.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$2")/calls"; cp "$1" "$2"\n'); fake.chmod(0o755)
  d = tmp_path / "models"
  env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "LLAMA_QUANTIZE": str(fake),
         "LLAMA_VOCAB": str(LLAMA_VOCAB), "QWEN_VOCAB": str(QWEN_VOCAB)}
  run = lambda *a: subprocess.run(["bash", ROOT / "scripts/make_models.sh", "--dir", d, *a], env=env, capture_output=True, text=True, timeout=300)
  r = run("--rm-f16", "tiny-llama-Q8_0", "tiny-qwen3-Q4_K_M", "tiny-llama-Q4_K_M")
  assert r.returncode == 0, r.stdout + r.stderr
  assert sorted(p.name for p in d.glob("*.gguf")) == ["tiny-llama-Q4_K_M.gguf", "tiny-llama-Q8_0.gguf", "tiny-qwen3-Q4_K_M.gguf"]
  calls = (d / "calls").read_text().splitlines()
  assert [c.split()[0].rsplit("/", 1)[1] for c in calls] == ["tiny-llama-F16.gguf", "tiny-qwen3-F16.gguf", "tiny-llama-F16.gguf"]
  assert [c.split()[2] for c in calls] == ["Q8_0", "Q4_K_M", "Q4_K_M"]
  from orin_llm.gguf_file import GGUFFile
  assert {t.qtype.name for t in GGUFFile(d / "tiny-qwen3-Q4_K_M.gguf").tensors.values()} == {"F16", "F32"}  # the F16 file, copied
  r = run("tiny-llama-Q8_0")
  assert r.returncode == 0 and "exists" in r.stdout and len((d / "calls").read_text().splitlines()) == 3
