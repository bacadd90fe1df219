"""Speculative decoding: proposals for the next tokens, checked by the model in one verify step (engine.verify).

On the Orin a decode step is a read of every weight, and scoring k proposed tokens in one step reads the same bytes
as producing one. A verify step runs the last chosen token and k-1 proposals at once; each row's choice is made as
plain decoding makes it (greedy, or sampled with the noise of its position), and the proposals are accepted while
they equal those choices. For proposals that are a deterministic function of the text (n-gram lookup, a draft model
decoding greedily) that is exactly the speculative-sampling rule: a proposal d is accepted with probability p(d),
and on rejection the emitted token is a sample of p given that it is not d. Greedy output is the plain path's,
token for token; sampled output has the target's distribution (and, with the same seed, the plain path's tokens).

Two sources of proposals:
- NgramDraft: the longest recent n-gram of the text so far that occurred before proposes what followed it then
  (prompt lookup: pays where the answer copies its prompt: editing, extraction, summaries).
- ModelDraft: a small model with the same vocabulary, decoding greedily in an engine of its own.
Both are adaptive (Speculator): the number of proposals grows while they are accepted and shrinks when they are
not, and after a run of misses plain decoding runs for a while, so an answer that copies nothing loses little.
"""
from __future__ import annotations
from dataclasses import dataclass, field

class NgramDraft:
  """Proposals from the text so far: after the last n tokens (n from max_n down to min_n), what followed their
  most recent earlier occurrence. The index of n-gram -> position after it grows as the text does."""
  def __init__(self, max_n: int = 3, min_n: int = 2):  # a lone repeated token is weak evidence: its proposals mostly fail
    self.max_n, self.min_n = max_n, min_n
    self.index: dict[tuple, int] = {}
    self.tokens: list[int] = []

  def _sync(self, tokens: list[int]):
    if tokens[:len(self.tokens)] != self.tokens:  # another text: index it afresh
      self.index, self.tokens = {}, []
    # n-grams that end before the last token (their continuation is known), oldest first, so the newest wins
    for end in range(max(len(self.tokens) - 1, 0) + 1, len(tokens)):
      for n in range(self.min_n, self.max_n + 1):
        if end - n >= 0: self.index[tuple(tokens[end - n:end])] = end
    self.tokens = list(tokens)

  def propose(self, tokens: list[int], k: int) -> list[int]:
    """Up to k tokens to follow `tokens` (the text so far, the last chosen token included)."""
    self._sync(tokens)
    for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
      if (at := self.index.get(tuple(tokens[-n:]))) is not None:
        return tokens[at:at + k]
    return []

class ModelDraft:
  """Proposals from a draft model with the same vocabulary, decoding greedily in slot 0 of its own engine. Its
  KV cache follows the target's text: what it drafted and the target accepted is already in it, the rest is
  overwritten (rolled back by bookkeeping, as the target's is)."""
  def __init__(self, engine):
    self.eng = engine

  def propose(self, tokens: list[int], k: int) -> list[int]:
    from orin_llm.sampling import Sampling
    e, s = self.eng, self.eng.slots[0]
    if len(tokens) + k >= e.max_context: return []
    common = e.common_prefix(0, tokens[:-1])  # what of the target's text the draft's KV cache holds
    s.cached = s.cached[:common]
    missing = tokens[common:]  # at least the last token
    if len(missing) <= 2:  # what it drafted and the target accepted (and the target's own token): decode steps
      for t in missing[:-1]:
        s.next = t; e.decode([0], 1)
      s.next = missing[-1]
      return e.decode([0], k)[:, 0].tolist()
    first = e.prefill(0, tokens, Sampling())  # a text it has not followed: read the rest as a prompt
    return [first] + (e.decode([0], k - 1)[:, 0].tolist() if k > 1 else [])

PAYS_DECAY = 0.5  # weight of the older verify steps in the running mean of what they paid
MAX_REST = 256  # tokens of plain decoding, at most, between two tries of proposals that did not pay

@dataclass
class Speculator:
  """How many proposals to verify next, from how the last ones fared. k stays within [min_k, max_k] (1 + k rows
  fit a compiled verify step); after `patience` verify steps in a row that accepted nothing, plain decoding runs
  `rest` tokens before proposals are tried again.
  cost: the verify step's cost by rows, in plain decode steps (Engine.verify_costs fills it before the first
  proposal; {}: verify steps cost nothing extra). Where the recent verify steps emitted fewer tokens than they
  cost in decode steps (a running mean, `pays`), plain decoding runs, for twice as long each time the next try
  does not pay either (up to MAX_REST tokens), so that speculating is never much slower than not (docs/PERF.md: a
  verify of 8 rows cost 4.1-4.5 decode steps on SmolLM2 with the heuristic kernels). Tokens emitted per step, not
  a per-token acceptance: copied spans are accepted in runs that end all at once, which a per-token rate
  undervalues. A draft model's own steps are not in the cost."""
  source: object
  max_k: int = 7
  min_k: int = 2
  patience: int = 3
  rest: int = 16
  k: int = 4
  misses: int = 0
  resting: int = 0
  steps: int = 0
  proposed: int = 0
  accepted: int = 0
  emitted: int = 0
  history: list = field(default_factory=list)
  cost: dict | None = None
  backoff: int = 0
  pays: float | None = None  # running mean of tokens emitted per decode step's worth of verify cost

  def want(self) -> int:
    """Proposals to ask for now (0: decode plainly this time)."""
    if self.resting > 0: return 0
    return self.k

  def rested(self, n: int): self.resting = max(0, self.resting - n)

  def stretch(self, lookahead: int) -> int:
    """Tokens of plain decoding to run before proposals are asked for again: all of `lookahead` while resting, else
    2, so that a copied span is found within a token or two of its start (its first tokens are what pays)."""
    return lookahead if self.resting > 0 else min(2, lookahead)

  def update(self, proposed: int, accepted: int):
    self.steps += 1; self.proposed += proposed; self.accepted += accepted; self.emitted += accepted + 1
    if accepted == proposed: self.k = min(self.max_k, self.k + 1)
    elif accepted < proposed // 2: self.k = max(self.min_k, self.k - 1)
    self.misses = self.misses + 1 if accepted == 0 else 0
    if self.misses >= self.patience: self.resting, self.misses = self.rest, 0
    if self.cost:
      rows = [K for K in sorted(self.cost) if K >= proposed + 1]
      r = (accepted + 1) / self.cost[rows[0]] if rows else 0.0
      self.pays = r if self.pays is None else PAYS_DECAY * self.pays + (1 - PAYS_DECAY) * r
      if self.pays < 1.0:
        self.backoff = min(MAX_REST, max(self.rest, 2 * self.backoff))
        self.resting = max(self.resting, self.backoff)
        self.pays = None  # the next try is judged on its own
      else: self.backoff = 0

  def stats(self) -> dict:
    return {"verify_steps": self.steps, "proposed": self.proposed, "accepted": self.accepted,
            "acceptance": self.accepted / self.proposed if self.proposed else 0.0,
            "tokens_per_step": self.emitted / self.steps if self.steps else 0.0}

MODES = ("off", "ngram", "draft")

def check_draft(target, draft) -> None:
  """A draft model must speak the target's vocabulary: the same token ids for the same texts."""
  from orin_llm.errors import OrinError
  if draft.cfg.vocab_size != target.cfg.vocab_size or \
     draft.file.metadata.get("tokenizer.ggml.tokens") != target.file.metadata.get("tokenizer.ggml.tokens"):
    raise OrinError(f"the draft model {draft.path} has another vocabulary than {target.path}: it cannot propose tokens for it")

def source_for(mode: str, draft_engine=None):
  """A fresh proposal source for one sequence: n-gram lookup keeps per-text state, a draft model is shared."""
  if mode == "ngram": return NgramDraft()
  if mode == "draft": return ModelDraft(draft_engine)
  raise ValueError(f"speculative mode {mode!r} (expected one of {MODES})")
