"""Bad inputs to the CLI: each gets one clear line naming the problem and a non-zero exit, no traceback."""
import os, struct, subprocess, sys
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB

@pytest.fixture(scope="module")
def good(tmp_path_factory):
  # ffn_up alone is Q4_0 (test_unsupported_tensor_type turns it into IQ4_NL, a type of the same block size and bytes)
  return write_model(tmp_path_factory.mktemp("err") / "good.gguf", preset("tiny-llama", n_layers=1), QT.Q8_0, LLAMA_VOCAB,
                     vocab_size=512, types={"ffn_up.weight": QT.Q4_0})

def cli(*args):
  r = subprocess.run([sys.executable, "-m", "orin_llm", *map(str, args)], capture_output=True, text=True, timeout=300,
                     env={**os.environ, "DEV": "CPU"})
  return r.returncode, r.stderr

def expect_error(args, *words):
  code, err = cli(*args)
  assert code != 0, err
  assert "Traceback" not in err, err
  line = [l for l in err.splitlines() if "error:" in l]
  assert len(line) == 1, err
  for w in words: assert w in line[0], (w, line[0])

def patched(good, tmp_path, edit) -> str:
  data = bytearray(good.read_bytes())
  edit(data)
  p = tmp_path / "bad.gguf"
  p.write_bytes(bytes(data))
  return str(p)

def replace_once(data: bytearray, old: bytes, new: bytes):
  assert len(old) == len(new) and data.count(old) == 1, data.count(old)
  i = data.index(old); data[i:i + len(old)] = new

def test_truncated(good, tmp_path):
  bad = patched(good, tmp_path, lambda d: d.__delitem__(slice(len(d) // 2, None)))
  expect_error(["info", bad], "truncated")
  expect_error(["generate", "--model", bad, "-p", "hi"], "truncated")

def test_truncated_in_the_vocabulary(good, tmp_path):
  """Cut inside the tokens' string array (read in a loop of its own), or with a token's bytes made invalid UTF-8."""
  data = good.read_bytes()
  at = data.index(b"tokenizer.ggml.tokens") + 200
  p = tmp_path / "cut.gguf"; p.write_bytes(data[:at])
  expect_error(["info", p], "truncated")
  # the array: value type, element type, count, then per token a u64 length and its bytes; spoil the first's text
  first = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8
  assert struct.unpack_from("<Q", data, first)[0] >= 1
  bad = bytearray(data); bad[first + 8] = 0xFF  # never valid in UTF-8
  p.write_bytes(bytes(bad))
  expect_error(["info", p], "UTF-8")

def test_metadata_matches_gguf_reader(good):
  """Our header parser against the gguf package's, on every metadata value (the vocabulary's strings included)."""
  import gguf
  from orin_llm.gguf_file import GGUFFile
  ours, theirs = GGUFFile(good).metadata, gguf.GGUFReader(good).fields
  for k, f in theirs.items():
    if k.startswith("GGUF."): continue
    want = f.contents()
    assert ours[k] == (want if not isinstance(want, float) else pytest.approx(want)), k
  assert len(ours["tokenizer.ggml.tokens"]) == 512

def test_wrong_magic(good, tmp_path):
  expect_error(["info", patched(good, tmp_path, lambda d: d.__setitem__(slice(0, 4), b"GGML"))], "not a GGUF file")

def test_unsupported_version(good, tmp_path):
  expect_error(["info", patched(good, tmp_path, lambda d: d.__setitem__(slice(4, 8), struct.pack("<I", 7)))], "unsupported GGUF version 7")

def test_unsupported_architecture(good, tmp_path):
  def edit(d):
    replace_once(d, b"general.architecture" + struct.pack("<IQ", 8, 5) + b"llama", b"general.architecture" + struct.pack("<IQ", 8, 5) + b"gemma")
  expect_error(["generate", "--model", patched(good, tmp_path, edit), "-p", "hi"], "unsupported architecture", "gemma")

def test_unsupported_tensor_type(good, tmp_path):
  def edit(d):  # ffn_up's type field: Q4_0 -> IQ4_NL, a type of the same block size that orin_llm does not support
    name = b"blk.0.ffn_up.weight"
    at = d.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    ndim = struct.unpack_from("<I", d, at)[0]
    at += 4 + 8 * ndim
    assert struct.unpack_from("<I", d, at)[0] == QT.Q4_0
    d[at:at + 4] = struct.pack("<I", QT.IQ4_NL)
  expect_error(["generate", "--model", patched(good, tmp_path, edit), "-p", "hi"], "blk.0.ffn_up.weight", "unsupported type IQ4_NL")

def test_shape_not_matching_metadata(good, tmp_path):
  key = b"llama.feed_forward_length"
  def edit(d): replace_once(d, key + struct.pack("<II", 4, 512), key + struct.pack("<II", 4, 768))
  expect_error(["generate", "--model", patched(good, tmp_path, edit), "-p", "hi"], "shape", "metadata implies")

def test_prompt_longer_than_context(good):
  expect_error(["generate", "--model", good, "--context", "16", "-p", "word " * 40], "prompt has", "context holds 16")

def test_missing_file(tmp_path):
  expect_error(["generate", "--model", tmp_path / "nope.gguf", "-p", "hi"], "not found")

def test_chat_two_turns_from_stdin(good):
  """`orin-llm chat` reads turns from a pipe, answers each, and reuses the cache of the earlier turn."""
  r = subprocess.run([sys.executable, "-m", "orin_llm", "chat", "--model", good, "-n", "4", "--temperature", "0"],
                     input="hello there\nand again\n", capture_output=True, text=True, timeout=300, env={**os.environ, "DEV": "CPU"})
  assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stdout.endswith("\n") and r.stdout.count("\n") >= 2, r.stdout  # each reply ends its line (a random model's text may hold more)
