"""Tokenizer ids against llama.cpp's (tests/data/token_ids.json, made by tests/data/make_token_ids.py)."""
import json, pathlib
import pytest
from orin_llm.errors import OrinError
from orin_llm.tokenizer import Tokenizer
from vocab_files import tokenizer

REF = json.loads((pathlib.Path(__file__).parent / "data" / "token_ids.json").read_text())
VOCABS = list(REF["vocabs"])

@pytest.mark.parametrize("name", VOCABS)
def test_ids_match_llama_cpp(name):
  tok, ref = tokenizer(name), REF["vocabs"][name]
  for text, case in zip(REF["texts"], ref["cases"]):
    assert tok.encode(text, bos=False) == case["ids"], text
    assert tok.encode(text) == case["ids_bos"], text
    assert tok.encode(text, bos=True) == [ref["bos"]] + case["ids"], text
    assert tok.encode(text, bos=False, special=False) == case["ids_nospecial"], text

@pytest.mark.parametrize("name", VOCABS)
def test_vocab_attributes(name):
  tok, ref = tokenizer(name), REF["vocabs"][name]
  assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.vocab_size) == (ref["bos"], ref["eos"], ref["add_bos"], ref["n_tokens"])
  assert tok.stop_ids == frozenset(ref["eog"]) and isinstance(tok.stop_ids, frozenset)

@pytest.mark.parametrize("name", VOCABS)
def test_pieces_match_llama_cpp(name):
  tok = tokenizer(name)
  for text, case in zip(REF["texts"], REF["vocabs"][name]["cases"]):
    assert [tok.piece(i).hex() for i in case["ids"]] == case["pieces"], text
    assert [tok.piece(i, special=True).hex() for i in case["ids"]] == case["pieces_special"], text

@pytest.mark.parametrize("name", VOCABS)
def test_decode_round_trips(name):
  tok = tokenizer(name)
  for text in REF["texts"]:
    assert tok.decode(tok.encode(text, special=False)) == text
    assert tok.decode(tok.encode(text, bos=False), special=True) == text  # special tokens parsed, then written back
  assert tok.decode(tok.encode("Hi", bos=True), special=True) == tok.token_text(tok.bos_id) + "Hi"

@pytest.mark.parametrize("name", VOCABS)
def test_stream_holds_split_characters(name):
  tok, held = tokenizer(name), 0
  for text in ["emoji: 😀👍🏽 🇫🇷 👩‍👩‍👧", "🦙🦙🦙 中文测试：你好，世界！", "🌍🌍日本 ﬁ½℃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]:
    ids = tok.encode(text, bos=False)
    s = tok.stream()
    chunks = [s.push(i) for i in ids] + [s.flush()]
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == tok.decode(ids) == text
    held += sum(1 for i, c in zip(ids, chunks) if not _valid_utf8(tok.piece(i)) and c == "")
  assert held > 0  # some characters really were split across tokens and held back

def _valid_utf8(b):
  try: b.decode("utf-8"); return True
  except UnicodeDecodeError: return False

def test_stream_flushes_incomplete_bytes():
  tok = tokenizer("llama-bpe")
  ids = tok.encode("😀", bos=False)
  assert len(ids) > 1  # 😀 is several byte-level tokens in Llama 3
  s = tok.stream()
  assert [s.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
  assert s.flush() == "\ufffd"  # an unfinished character ends as one replacement, like decode()
  assert tok.decode(ids[:-1]) == "\ufffd"

def test_special_tokens_llama3():
  tok = tokenizer("llama-bpe")
  eot = tok.encode("<|eot_id|>", bos=False)
  assert eot == [128009] and tok.token_text(128009) == "<|eot_id|>" and 128009 in tok.stop_ids and tok.is_control(128009)
  assert len(tok.encode("<|eot_id|>", bos=False, special=False)) > 1
  assert tok.decode([128000, 9906, 128009]) == "Hello"  # control tokens are hidden unless asked for
  assert tok.decode([128000, 9906, 128009], special=True) == "<|begin_of_text|>Hello<|eot_id|>"
  s = tok.stream(special=True)
  assert "".join(s.push(i) for i in [9906, 128009]) + s.flush() == "Hello<|eot_id|>"

def test_special_tokens_qwen2():
  tok = tokenizer("qwen2")
  assert tok.encode("<|im_start|>user\nHi<|im_end|>")[0] == 151644 and tok.encode("<|im_end|>") == [151645]
  assert 151645 in tok.stop_ids and 151643 in tok.stop_ids and 151644 not in tok.stop_ids
  # user-defined tokens are parsed even without special, and decode to their text (llama.cpp's behaviour)
  assert tok.encode("[PAD151650]", special=False) == [151650] and tok.decode([151650]) == "[PAD151650]"

def test_special_tokens_smollm():
  tok = tokenizer("smollm")
  assert tok.stop_ids == {0, 2, 4}  # <|endoftext|>, <|im_end|> (eos), <reponame> (llama.cpp's FIM repo token ends generation)
  assert tok.encode("<|im_start|>assistant\n") == [1, 520, 9531, 198] and not tok.add_bos

def test_unsupported_tokenizers():
  md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": [1, 1, 1]}
  with pytest.raises(OrinError, match="pre-tokenizer 'gpt-4o'"): Tokenizer.from_metadata(md)
  with pytest.raises(OrinError, match="tokenizer model 'llama'"): Tokenizer.from_metadata({**md, "tokenizer.ggml.model": "llama"})
  with pytest.raises(OrinError, match="add_bos_token"): Tokenizer.from_metadata({**md, "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.add_bos_token": True})
  tiny = Tokenizer.from_metadata({**md, "tokenizer.ggml.pre": "qwen2"})
  assert tiny.encode("ab") == [2] and tiny.stop_ids == frozenset()
  with pytest.raises(OrinError, match="out of the vocabulary"): tiny.decode([3])
