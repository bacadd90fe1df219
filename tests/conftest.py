import logging, os, pathlib, sys, types, zlib
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

def seed_for(what: str) -> int:
  """The seed of one draw (a synthetic model, a test's inputs), from the run's seed and the draw's name."""
  print(f"{what}: ORIN_TEST_SEED={SEED}")
  return int(np.random.SeedSequence([SEED, zlib.crc32(what.encode())]).generate_state(1)[0])

@pytest.fixture(autouse=True)
def _environment_restored():
  """Each test leaves the environment as it found it: commands run in-process (serve, prewarm, bench) set tinygrad's
  BEAM settings in os.environ (kernel_cache.search_defaults), which later tests' subprocesses would inherit."""
  saved = dict(os.environ)
  yield
  if os.environ != saved: os.environ.clear(); os.environ.update(saved)

def _module_env(**env):
  """Sets env for a module's tests and clears tinygrad's cached getenv on the way in and out."""
  from tinygrad.helpers import getenv
  with pytest.MonkeyPatch.context() as mp:
    for k, v in env.items(): mp.setenv(k, v)
    getenv.cache_clear()
    yield
  getenv.cache_clear()

@pytest.fixture(scope="module")
def without_inner_unroll():
  """MV_INNER_UNROLL=0 and MV_ROWS_FIRST=0 for a module whose tests pin the opts of the matvec patches before 0020
  (0003, 0017): 0020's unroll of a single row's innermost range and 0022's rows-first layout, on by default, are
  test_0020's and test_0022's to check."""
  yield from _module_env(MV_INNER_UNROLL="0", MV_ROWS_FIRST="0")

@pytest.fixture(scope="module")
def one_sum():
  """quant.AFFINE off for a module whose tests pin the layouts of a single row's product as one sum (the matvec patches
  before 0039); quant reads ORIN_LLM_AFFINE once, at import, so the module's attribute is set."""
  from orin_llm import quant
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(quant, "AFFINE", ())
    yield

@pytest.fixture(scope="module")
def without_rows_first():
  """MV_ROWS_FIRST=0 for a module whose tests pin the row layout of the matvec patches before 0022 (0013, 0020)."""
  yield from _module_env(MV_ROWS_FIRST="0")

@pytest.fixture
def rng(request):
  """A test's random inputs (seed_for its id)."""
  return np.random.default_rng(seed_for(request.node.nodeid))

# ------------------------------------------------------------------ hostile clients (issue 23): test_hostile.py, test_fuzz.py
FUZZ_COUNTS: dict[str, str] = {}  # fuzzer -> what it ran, printed at the end of the run (so CI's log shows it)

def pytest_terminal_summary(terminalreporter):
  terminalreporter.write_line(f"ORIN_TEST_SEED={SEED} (random models and inputs; set it to replay this run)")  # also under -q
  if FUZZ_COUNTS:
    terminalreporter.write_sep("-", "fuzz cases")
    for name, what in FUZZ_COUNTS.items(): terminalreporter.write_line(f"{name}: {what}")

HOSTILE_KEY = "hostile-key"
# Llama 3's markup, and bombs that go off for one message content each (the sample conversation at load has none)
BOMB_TEMPLATE = (
  "{{ bos_token }}{% for m in messages %}"
  "{% if m.content == 'BOMB-LOOP' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
  "{% elif m.content == 'BOMB-MEM' %}{% set a = 'x' * 100000 %}{% set ns = namespace(d={}) %}"
  "{% for i in range(3000) %}{% set ns.d = dict(ns.d, **{(i|string): a ~ i}) %}{% endfor %}"
  "{% elif m.content == 'BOMB-OUT' %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"
  "{% elif m.content == 'BOMB-FORMAT' %}{{ '{:>1500000000}'.format('x') }}{% endif %}"
  "{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

def write_hostile_model(directory: pathlib.Path) -> pathlib.Path:
  """The synthetic model of test_server.py (its kernels are cached already), with BOMB_TEMPLATE as its chat template."""
  import gguf
  from gguf import GGMLQuantizationType as QT
  from orin_llm.gguf_file import GGUFFile
  from orin_llm.synth import write_model, preset
  md, vocab = GGUFFile(LLAMA_VOCAB).metadata, directory / "vocab.gguf"
  w = gguf.GGUFWriter(str(vocab), "llama")
  w.add_tokenizer_model(md["tokenizer.ggml.model"]); w.add_tokenizer_pre(md["tokenizer.ggml.pre"]); w.add_token_list(md["tokenizer.ggml.tokens"])
  w.add_token_types(md["tokenizer.ggml.token_type"]); w.add_token_merges(md["tokenizer.ggml.merges"])
  for k in ("bos", "eos"): w.add_uint32(f"tokenizer.ggml.{k}_token_id", md[f"tokenizer.ggml.{k}_token_id"])
  w.add_chat_template(BOMB_TEMPLATE)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return write_model(directory / "hostile.gguf", preset("tiny-llama"), QT.Q4_K, vocab, seed=0, types={"token_embd.weight": QT.Q8_0})

class LogCollector(logging.Handler):
  """Every record of the server's process; problems(): errors and anything with a traceback."""
  def __init__(self):
    super().__init__(logging.DEBUG)
    self.records: list[logging.LogRecord] = []
  def emit(self, record): self.records.append(record)
  def problems(self, since: int = 0) -> list[str]:
    return [self.format(r) for r in self.records[since:] if r.levelno >= logging.ERROR or r.exc_info]

@pytest.fixture(scope="session")
def hostile(tmp_path_factory):
  """A server with tight limits on a model with a booby-trapped template: (base URL, config, log collector)."""
  from test_server import running
  from orin_llm.server.config import ServerConfig
  model = write_hostile_model(tmp_path_factory.mktemp("hostile-model"))
  cfg = ServerConfig(model=str(model), port=0, context_length=256, api_key=HOSTILE_KEY, queue_size=2, max_tokens_default=2, max_batch=2,
                     max_prompt_tokens=64, max_connections=16, header_timeout=1.0, body_timeout=1.5, keepalive_timeout=2.0,
                     template_timeout=1.0, template_memory_mb=64, template_max_output=200_000)
  log = LogCollector()
  logging.getLogger().addHandler(log)
  try:
    with running(cfg) as base: yield types.SimpleNamespace(base=base, cfg=cfg, log=log, key=HOSTILE_KEY)
  finally: logging.getLogger().removeHandler(log)

def run_in_own_session(args: list, env: dict, timeout: float) -> tuple[str, str]:
  """(stdout, stderr) of a command run in a process group of its own; whatever is left of that group afterwards (worker
  pools, fork servers of a run that hung) is killed. A run past `timeout` gives stdout "" and stderr saying so."""
  import signal, subprocess
  p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try: return p.communicate(timeout=timeout)
  except subprocess.TimeoutExpired: return "", f"{args[-1]} did not return in {timeout} s"
  finally:
    try: os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError: pass
