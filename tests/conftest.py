import os, pathlib, zlib
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

# Fresh random models and inputs every run, all drawn from one seed: $ORIN_TEST_SEED, else a new one. It is printed in
# pytest's header and summary and by every test that draws; ORIN_TEST_SEED=<it> replays the run, any of its tests alone included
# (each draw's seed comes from the run's and the draw's name, not from the order of the draws).
SEED = int(os.environ.get("ORIN_TEST_SEED") or np.random.SeedSequence().entropy % (1 << 32))

def pytest_report_header(config): return f"ORIN_TEST_SEED={SEED} (random models and inputs; set it to replay this run)"
def pytest_terminal_summary(terminalreporter):  # also under -q, which leaves out the header
  terminalreporter.write_line(f"ORIN_TEST_SEED={SEED} (random models and inputs; set it to replay this run)")

def seed_for(what: str) -> int:
  """The seed of one draw (a synthetic model, a test's inputs), from the run's seed and the draw's name."""
  print(f"{what}: ORIN_TEST_SEED={SEED}")
  return int(np.random.SeedSequence([SEED, zlib.crc32(what.encode())]).generate_state(1)[0])

@pytest.fixture
def rng(request):
  """A test's random inputs (seed_for its id)."""
  return np.random.default_rng(seed_for(request.node.nodeid))
