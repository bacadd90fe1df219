"""Byte-level BPE tokenizer from GGUF metadata that reproduces llama.cpp's token ids.

Splitting the text on special tokens, the special-token attributes and the end-of-generation set
follow llama.cpp's src/llama-vocab.cpp; the BPE itself (pre-tokenizer regex, merges) runs in the
Rust `tokenizers` library, checked id for id against llama.cpp (tests/data/token_ids.json).

Decoding follows llama.cpp's token_to_piece: control and unknown tokens decode to nothing unless
special=True, user-defined tokens to their text, byte tokens to their byte, normal tokens through the
GPT-2 byte map. decode() is the concatenation of those pieces, as llama.cpp's generation output is;
llama_detokenize's clean_up_tokenization_spaces pass (" ." -> "." for some vocabularies, llama-bpe
among them) is not applied, so decode(encode(x)) == x and decode() equals the streamed text.
"""
from __future__ import annotations
import codecs, re
from typing import Any, Iterable
from tokenizers import Regex, Tokenizer as HFTokenizer, models, pre_tokenizers
from orin_llm.errors import OrinError

# GGUF token types (llama.cpp's llama_token_type); treated as attribute flags below
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's pre-tokenizer regexes (llm_tokenizer_bpe), applied one after the other
_LLAMA3 = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# llama.cpp's GPT-2 regex lacks the final |\s+, but its hand-written splitter for it
# (unicode_regex_split_custom_gpt2) splits leftover whitespace exactly as |\s+ does
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# tokenizer.ggml.pre -> (regexes, ignore_merges, llama.cpp's add_bos default); aliases share llama.cpp's code path
_PRE = {"llama-bpe": ([_LLAMA3], True, True), "llama3": ([_LLAMA3], True, True), "llama-v3": ([_LLAMA3], True, True),
        "qwen2": ([_QWEN2], False, False), "deepseek-r1-qwen": ([_QWEN2], False, False),
        "smollm": ([r"\p{N}", _GPT2], False, False)}

# Tokens llama.cpp finds by their text (llama_vocab::impl::load): they become control tokens,
# and the end-of-generation set is EOG_TEXTS plus eos, eot, eom and the FIM pad/repo/sep tokens.
_EOT = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
        "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM = {"pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
        "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
        "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"),
        "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
        "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
        "sep": ("<|file_sep|>",)}
_EOG = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>",
        "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
        "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}

# Placeholders for control-token text in message content (Tokenizer.as_text): Supplementary Private Use Area-A and -B,
# characters no tokenizer gives meaning to, skipping any that the content or the template itself holds
_PUA = re.compile("[\U000F0000-\U0010FFFD]")
_PUA_RANGE = range(0xF0000, 0x10FFFE)

class TooLong(OrinError):
  """encode(max_tokens=...) stopped: the text has more than max_tokens tokens (`tokens`, a lower bound)."""
  def __init__(self, tokens: int, limit: int):
    super().__init__(f"the text has {tokens} tokens or more, over the limit of {limit}")
    self.tokens, self.limit = tokens, limit

def _byte_decoder() -> dict[str, int]:
  # GPT-2's byte -> printable character map (bytes_to_unicode), inverted
  bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  rest = [b for b in range(256) if b not in bs]
  return {chr(c): b for b, c in zip(bs + rest, bs + [256 + n for n in range(len(rest))])}
_BYTE_DECODER = _byte_decoder()

class Tokenizer:
  def __init__(self, tokens: list[str], token_types: list[int], merges: list[str], pre: str, bos_id: int | None,
               eos_id: int | None, add_bos: bool | None = None, special_ids: dict[str, int] | None = None):
    if pre not in _PRE: raise OrinError(f"unsupported pre-tokenizer {pre!r:.60} (tokenizer.ggml.pre); supported: {', '.join(sorted(_PRE))}")
    regexes, ignore_merges, default_add_bos = _PRE[pre]
    self.tokens, self.pre, self.vocab_size = tokens, pre, len(tokens)
    self.bos_id, self.eos_id = bos_id, eos_id
    self.add_bos = default_add_bos if add_bos is None else bool(add_bos)
    if self.add_bos and bos_id is None: raise OrinError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens): raise OrinError("the vocabulary (tokenizer.ggml.tokens) has duplicate tokens")
    self._types = list(token_types) if token_types else [NORMAL] * len(tokens)
    self.stop_ids = frozenset(self._find_special(vocab, special_ids or {}))
    # llama.cpp splits special tokens out of the text longest (in bytes) first; user-defined ones even when special=False
    specials = sorted((i for i, t in enumerate(self._types) if t in (CONTROL, USER_DEFINED, UNKNOWN) and tokens[i]), key=lambda i: -len(tokens[i].encode()))
    self._specials = [(tokens[i], i) for i in specials]
    self._user_defined = [(tokens[i], i) for i in specials if self._types[i] == USER_DEFINED]
    self._special_re = re.compile("|".join(re.escape(t) for t, _ in self._specials)) if specials else None
    self._user_re = re.compile("|".join(re.escape(t) for t, _ in self._user_defined)) if self._user_defined else None
    # the tokens that only special parsing makes: what message content must never produce (as_text)
    self._control = [t for t, i in self._specials if self._types[i] != USER_DEFINED]
    self._control_re = re.compile("|".join(re.escape(t) for t in self._control)) if self._control else None
    self._edges: tuple[frozenset[str], frozenset[str], int] | None = None
    # the most characters one token can stand for (its text's UTF-8 bytes bound its piece): a text longer than
    # n times this has more than n tokens, known without encoding it
    self.max_token_chars = max(len(t.encode()) for t in tokens)
    # llama.cpp splits a merge at the first space after its first character
    pairs = [(m[:k], m[k + 1:]) for m in merges if (k := m.find(" ", 1)) > 0]
    try: bpe = models.BPE(vocab, pairs, ignore_merges=ignore_merges)
    except Exception as e: raise OrinError(f"cannot build the BPE tokenizer from the GGUF vocabulary: {str(e)!r:.200}") from None
    self._hf = HFTokenizer(bpe)
    self._hf.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes] + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    self._pieces: list[bytes | None] = [None] * len(tokens)

  @classmethod
  def from_metadata(cls, md: dict) -> Tokenizer:
    model = md.get("tokenizer.ggml.model")
    if model != "gpt2": raise OrinError(f"unsupported tokenizer model {model!r:.60} (tokenizer.ggml.model); only byte-level BPE ('gpt2') is supported")
    if "tokenizer.ggml.tokens" not in md or "tokenizer.ggml.merges" not in md: raise OrinError("the GGUF file has no tokenizer vocabulary or merges")
    # a file from the internet may hold any type in any field: each is checked, so that a bad one is a line, not a traceback
    tokens, merges, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.merges"], md.get("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
      raise OrinError("tokenizer.ggml.tokens must be a non-empty array of strings")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges): raise OrinError("tokenizer.ggml.merges must be an array of strings")
    if types is not None and (not isinstance(types, list) or len(types) != len(tokens) or not all(type(t) is int for t in types)):
      raise OrinError(f"tokenizer.ggml.token_type must be an array of {len(tokens)} integers, one per token")
    def token_id(key):
      v = md.get(f"tokenizer.ggml.{key}_token_id")
      if v is not None and (type(v) is not int or not 0 <= v < len(tokens)):
        raise OrinError(f"tokenizer.ggml.{key}_token_id must be a token id in 0..{len(tokens) - 1}, not {v!r:.40}")
      return v
    special = {k: v for k in ("eot", "eom", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep") if (v := token_id(k)) is not None}
    pre, add_bos = md.get("tokenizer.ggml.pre", "default"), md.get("tokenizer.ggml.add_bos_token")
    if not isinstance(pre, str): raise OrinError(f"tokenizer.ggml.pre must be a string, not {pre!r:.40}")
    if add_bos is not None and not isinstance(add_bos, bool): raise OrinError(f"tokenizer.ggml.add_bos_token must be true or false, not {add_bos!r:.40}")
    return cls(tokens, types, merges, pre, token_id("bos"), token_id("eos"), add_bos, special)

  def _find_special(self, vocab: dict[str, int], ids: dict[str, int]) -> set[int]:
    """llama.cpp's text-based detection: marks eot/eom/fim/eog-looking tokens as control and returns the EOG set."""
    types, n = self._types, len(self.tokens)
    def mark(i):
      if types[i] not in (CONTROL, UNKNOWN): types[i] = CONTROL
    ids = {k: v for k, v in ids.items() if 0 <= v < n}
    found = {"eot": _EOT, "eom": ("<|eom_id|>",), **{f"fim_{k}": v for k, v in _FIM.items()}}
    for key, texts in found.items():
      if key in ids: continue
      hit = [vocab[t] for t in texts if t in vocab]
      if hit: ids[key] = min(hit); mark(ids[key])  # llama.cpp takes whichever its hash map yields first
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if k in ids}
    for t in _EOG & vocab.keys(): eog.add(vocab[t]); mark(vocab[t])
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: always rendered
      if t in vocab: types[vocab[t]] = USER_DEFINED
    eog |= {i for i in (self.eos_id, ids.get("eot"), ids.get("eom")) if i is not None and 0 <= i < n}
    texts = {self.tokens[i]: i for i in eog}
    # llama.cpp's workarounds: <|end|> is not EOG next to <|return|>/<|call|> (harmony) or <|calls|>/<|flush|> (solar-open),
    # and </s> is not EOG next to <|tool_response> (gemma4)
    if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts)) or ("<|calls|>" in texts and "<|flush|>" in texts)):
      eog.discard(texts["<|end|>"]); types[texts["<|end|>"]] = USER_DEFINED
    if "</s>" in texts and "<|tool_response>" in texts: eog.discard(texts["</s>"]); types[texts["</s>"]] = NORMAL
    return eog

  def encode(self, text: str, bos: bool | None = None, special: bool = True, literal: dict[int, str] | None = None,
             max_tokens: int | None = None) -> list[int]:
    """Token ids of text, as llama.cpp's tokenize. bos: prepend BOS (None: as the model says, self.add_bos).
    special: parse control tokens written in the text (e.g. '<|eot_id|>') as single tokens (parse_special);
    user-defined tokens are parsed either way, as in llama.cpp. literal: the table of as_text(), whose placeholders
    are encoded as the text they stand for. max_tokens: raise TooLong as soon as the ids are known to be more."""
    ids: list[int] = []
    if bos if bos is not None else self.add_bos:
      if self.bos_id is None: raise OrinError("the model has no BOS token (tokenizer.ggml.bos_token_id)")
      ids.append(self.bos_id)
    if max_tokens is not None and len(text) > max_tokens * self.max_token_chars: raise TooLong(-(-len(text) // self.max_token_chars), max_tokens)
    # one encode per fragment: encode_batch would start the tokenizers thread pool, which then warns on every fork
    for f in self._split_special(text, special):
      if isinstance(f, int): ids.append(f)
      else:
        if literal: f = f.translate(literal)
        ids.extend(self._hf.encode(f, add_special_tokens=False).ids)
      if max_tokens is not None and len(ids) > max_tokens: raise TooLong(len(ids), max_tokens)
    return ids

  def as_text(self, obj: Any, avoid: str = "") -> tuple[Any, dict[int, str]]:
    """Message content made plain text: obj (JSON-like: dicts, lists, strings; messages, tools) with every control
    token written in its strings replaced by a private-use character (none that obj or `avoid`, the template's
    source, holds), and the table that encode(literal=table) turns them back with, into text encoded as text.
    A piece of a control token at a string value's start or end (2 characters or more) is replaced too, so that
    two strings rendered side by side cannot complete one. The template sees strings of the same shape (trim,
    split and comparisons work as before); only its markup can still make a control token."""
    if self._control_re is None: return obj, {}
    if self._edges is None:
      pre = frozenset(t[:k] for t in self._control for k in range(2, len(t)))
      suf = frozenset(t[k:] for t in self._control for k in range(1, len(t) - 1))
      self._edges = pre, suf, max(map(len, self._control))
    pre, suf, longest = self._edges
    rx, table, free = self._control_re, {}, None
    def mark(text: str) -> str:
      nonlocal free
      if text not in table:
        if free is None:
          used = {ord(c) for t in (avoid, *strings(obj)) for c in _PUA.findall(t)}
          free = (chr(c) for c in _PUA_RANGE if c not in used)
        table[text] = next(free)
      return table[text]
    def edges(t: str) -> str:
      for k in range(min(longest, len(t)), 1, -1):  # the longest piece of a token that the string ends with
        if t[-k:] in pre: t = t[:-k] + mark(t[-k:]); break
      for k in range(min(longest, len(t)), 1, -1):
        if t[:k] in suf: t = mark(t[:k]) + t[k:]; break
      return t
    def walk(x, key=False):
      if isinstance(x, str):
        y = rx.sub(lambda m: mark(m.group()), x) if rx.search(x) else x
        return y if key else edges(y)
      if isinstance(x, dict): return {walk(k, True): walk(v) for k, v in x.items()}
      if isinstance(x, (list, tuple)): return type(x)(walk(v) for v in x)
      return x
    out = walk(obj)
    return out, {ord(v): k for k, v in table.items()}

  def _split_special(self, text: str, special: bool) -> list[str | int]:
    # llama.cpp's tokenizer_st_partition: each special token, longest first, splits every text fragment left
    table, rx = (self._specials, self._special_re) if special else (self._user_defined, self._user_re)
    if not text: return []
    if rx is None or not rx.search(text): return [text]
    frags: list[str | int] = [text]
    for tok, tid in table:
      if not any(isinstance(f, str) and tok in f for f in frags): continue
      out: list[str | int] = []
      for f in frags:
        if isinstance(f, int) or tok not in f: out.append(f); continue
        for k, part in enumerate(f.split(tok)):
          if k: out.append(tid)
          if part: out.append(part)
      frags = out
    return frags

  def piece(self, id: int, special: bool = False) -> bytes:
    """The bytes llama.cpp's token_to_piece gives for one token (may be part of a UTF-8 character)."""
    if not 0 <= id < self.vocab_size: raise OrinError(f"token id {id} is out of the vocabulary (size {self.vocab_size})")
    t = self._types[id]
    if t in (CONTROL, UNKNOWN): return self.tokens[id].encode() if special else b""
    if (p := self._pieces[id]) is None:
      text = self.tokens[id]
      if t == USER_DEFINED: p = text.encode()
      elif t == NORMAL: p = b"".join(bytes([_BYTE_DECODER[c]]) if c in _BYTE_DECODER else c.encode() for c in text)
      elif t == BYTE: p = bytes([int(text[3:5], 16)]) if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text) else b""
      else: p = b""  # unused/undefined tokens are suppressed like control tokens
      self._pieces[id] = p
    return p

  def decode(self, ids: Iterable[int], special: bool = False) -> str:
    """Text of ids: the concatenation of llama.cpp's pieces. Control tokens (BOS, <|eot_id|>, ...) give their text only
    with special=True (llama.cpp's detokenize default is special=False); invalid UTF-8 becomes U+FFFD."""
    return b"".join(self.piece(i, special) for i in ids).decode("utf-8", errors="replace")

  def token_text(self, id: int) -> str:
    """The vocabulary entry of id as stored in the GGUF file (e.g. 'Ġworld', '<|eot_id|>')."""
    if not 0 <= id < self.vocab_size: raise OrinError(f"token id {id} is out of the vocabulary (size {self.vocab_size})")
    return self.tokens[id]

  def is_control(self, id: int) -> bool: return self._types[id] in (CONTROL, UNKNOWN)

  def stream(self, special: bool = False) -> StreamDecoder: return StreamDecoder(self, special)

def strings(x) -> Iterable[str]:
  """Every string in a JSON-like value, dictionary keys included."""
  if isinstance(x, str): yield x
  elif isinstance(x, dict):
    for k, v in x.items(): yield from strings(k); yield from strings(v)
  elif isinstance(x, (list, tuple)):
    for v in x: yield from strings(v)

class StreamDecoder:
  """Incremental decode: push(id) returns the text completed by that token, holding back the bytes of a
  UTF-8 character split across tokens; flush() returns what is held (invalid bytes as U+FFFD).
  The concatenation of all returns equals Tokenizer.decode(ids)."""
  def __init__(self, tok: Tokenizer, special: bool = False):
    self.tok, self.special = tok, special
    self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
  def push(self, id: int) -> str: return self._dec.decode(self.tok.piece(id, self.special))
  def flush(self) -> str: return self._dec.decode(b"", final=True)
