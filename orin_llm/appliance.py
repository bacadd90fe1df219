"""What a server configuration loads: `orin-llm serve` builds its engine here, and `orin-llm prewarm --config` builds
the same one, so that the steps prewarm compiles and captures are the ones the server runs."""
from __future__ import annotations

def load(cfg, reach: bool = False):
  """The engine and tokenizer of a ServerConfig's model, in this thread (which opens the device): the model, its
  kernel database, the slots, and speculative decoding (eng.speculator: a factory of speculative.Speculator, one for
  each request that generates alone; None: off). reach: steps valid past the context (a prewarm: step_cache.steps_reach)."""
  from orin_llm.engine import Engine
  from orin_llm.tokenizer import Tokenizer
  from orin_llm import settings, kernel_cache
  device = settings.open_device()
  db = kernel_cache.prepare(cfg.model, cfg.kernel_cache_directory or True, device, cfg.kernel_cache_shipped)
  eng = Engine(cfg.model, max_context=cfg.context_length, device=device, kernel_db=db, max_batch=cfg.max_batch, reach=reach,
               prefill_copy_mb=cfg.prefill_copy_mb)
  eng.speculator = None  # a factory of speculative.Speculator, one for each request that generates alone
  if cfg.draft_model or cfg.speculative != "off":
    from orin_llm import speculative
    if cfg.draft_model:  # its kernels go to the model's database (keyed by each kernel), its planes and steps beside it
      from orin_llm.loader import open_model
      draft = Engine(cfg.draft_model, max_context=eng.max_context, device=device,
                     kernel_db=kernel_cache.Prepared(*open_model(cfg.draft_model), db.db), reach=reach,
                     prefill_copy_mb=eng.prefill_copy_left())  # one bound for both engines' copies
      speculative.check_draft(eng, draft)
      eng.speculator = lambda: speculative.Speculator(speculative.ModelDraft(draft))
    else: eng.speculator = lambda: speculative.Speculator(speculative.NgramDraft())
  return eng, Tokenizer.from_metadata(eng.file.metadata)
