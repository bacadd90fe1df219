import os, pathlib
import numpy as np
import pytest

os.environ.setdefault("DEV", "CPU")
# the server and prewarm cache kernels and planes: never in the user's ~/.cache during tests
import tempfile
os.environ.setdefault("ORIN_LLM_CACHE_DIR", tempfile.mkdtemp(prefix="orin-llm-test-cache-"))
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
LLAMA_VOCAB = SHARED / "ggml-vocab-llama-bpe.gguf"
QWEN_VOCAB = SHARED / "ggml-vocab-qwen2.gguf"

@pytest.fixture
def rng(request):
  """Fresh random inputs every run; the seed is printed so that a failure can be replayed."""
  seed = int(os.environ.get("ORIN_TEST_SEED", np.random.SeedSequence().entropy % (1 << 32)))
  print(f"{request.node.name}: ORIN_TEST_SEED={seed}")
  return np.random.default_rng(seed)
