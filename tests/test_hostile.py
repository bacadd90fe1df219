"""Hostile model files and hostile clients (issue 23): each case an attacker found gets a one-line error or a
clean 4xx, within bounds of time and memory, while the server keeps answering /health."""
import struct, time
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm.config import config_from_gguf
from orin_llm.errors import OrinError
from orin_llm.gguf_file import GGUFFile
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB
from gguf_layout import find, put, walk

# ------------------------------------------------------------------ model files (item 7)
@pytest.fixture(scope="module")
def small(tmp_path_factory):
  p = write_model(tmp_path_factory.mktemp("hostile") / "small.gguf", preset("tiny-llama", n_layers=2), QT.Q4_0, LLAMA_VOCAB, vocab_size=512)
  data = p.read_bytes()
  return p, data, walk(data)[0]

def load(path):
  f = GGUFFile(path)
  return config_from_gguf(f)

def altered(small, tmp_path, edit) -> str:
  path, data, fields = small
  buf = bytearray(data)
  edit(buf, fields)
  p = tmp_path / "altered.gguf"
  p.write_bytes(bytes(buf))
  return str(p)

def expect_error(path, *words, seconds=5.0):
  t0 = time.monotonic()
  with pytest.raises(OrinError) as e: load(path)
  msg = str(e.value)
  assert "\n" not in msg and all(w in msg for w in words), msg
  assert time.monotonic() - t0 < seconds, "the check took too long (allocated before checking?)"
  return msg

def set_value(key, value, kind="value"):
  return lambda buf, fields: put(buf, find(fields, kind, key), value)

def alignment(value):
  def edit(buf, fields):  # general.file_type (u32) renamed general.alignment: the same length
    k = find(fields, "key", "general.file_type")
    buf[k.pos:k.pos + k.size] = b"general.alignment"
    put(buf, find(fields, "value", "general.file_type"), value)
  return edit

def shift_offset(name, by):
  def edit(buf, fields):
    f = find(fields, "offset", name)
    put(buf, f, struct.unpack_from("<Q", buf, f.pos)[0] + by)
  return edit

BAD_FILES = {
  "alignment 0": (alignment(0), ["general.alignment", "power of two"]),            # was ZeroDivisionError
  "alignment 48": (alignment(48), ["general.alignment", "power of two"]),
  "head_count 0": (set_value("llama.attention.head_count", 0), ["head_count"]),   # was ZeroDivisionError
  "head_count_kv 0": (set_value("llama.attention.head_count_kv", 0), ["head_count_kv"]),
  "block_count 2^32-1": (set_value("llama.block_count", 0xFFFFFFFF), ["block_count", "2 blocks"]),  # was 45 s, then MemoryError
  "block_count 0": (set_value("llama.block_count", 0), ["block_count"]),               # was accepted
  "context_length 0": (set_value("llama.context_length", 0), ["context_length"]),      # was accepted
  "embedding_length 0": (set_value("llama.embedding_length", 0), ["embedding_length"]),
  "odd key_length": (set_value("llama.attention.key_length", 63), ["key_length", "even"]),
  "NaN epsilon": (set_value("llama.attention.layer_norm_rms_epsilon", float("nan")), ["layer_norm_rms_epsilon"]),
  "norm as Q4_1": (set_value("blk.0.attn_norm.weight", QT.Q4_1, "ttype"), ["blk.0.attn_norm.weight", "Q4_1", "F32, F16 or BF16"]),  # was accepted
  "5 dimensions": (set_value("output_norm.weight", 5, "ndim"), ["output_norm.weight", "dimensions"]),
  "2^40 metadata entries": (set_value("n_kv", 1 << 40, "count"), ["corrupt"]),
  "2^40 tensors": (set_value("n_tensors", 1 << 40, "count"), ["corrupt"]),
  "dims overflowing int64": (lambda buf, fields: [put(buf, find(fields, "dim", "token_embd.weight", i), 1 << 32) for i in (0, 1)], ["2^62"]),
  "unaligned offset": (shift_offset("blk.0.ffn_up.weight", 1), ["blk.0.ffn_up.weight", "alignment"]),
  "a u32 read as a string": (set_value("llama.block_count", 8, "vtype"), ["truncated"]),
}

@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_metadata_one_line_error(small, tmp_path, case):
  edit, words = BAD_FILES[case]
  expect_error(altered(small, tmp_path, edit), *words)

def test_unaltered_file_loads(small):
  assert load(small[0]).n_layers == 2
