"""Chat templates: real templates render the expected prompts; templates cannot escape the sandbox."""
from datetime import datetime
import pytest
from orin_llm.chat import ChatTemplate
from orin_llm.errors import OrinError
from vocab_files import metadata, tokenizer

MSGS = [{"role": "user", "content": "What is 2+2?"}]

def test_smollm2_template():
  t = ChatTemplate.from_metadata(metadata("smollm"))
  assert not t.is_fallback and t.bos_token == "<|im_start|>" and t.eos_token == "<|im_end|>"
  assert t.render(MSGS) == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  conv = [{"role": "system", "content": "Be brief."}, *MSGS, {"role": "assistant", "content": "4"}]
  assert t.render(conv, add_generation_prompt=False) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                                                         "<|im_start|>assistant\n4<|im_end|>\n")
  ids = tokenizer("smollm").encode(t.render(MSGS))
  assert ids[0] == 1 and ids[-3:] == [1, 520, 9531, 198][-3:] and ids.count(2) == 2

def test_qwen2_template():
  t = ChatTemplate.from_metadata(metadata("qwen2"))
  assert t.render(MSGS).startswith("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n")

# Llama 3 Instruct's template (the llama-bpe vocabulary file has none), trimmed of tools
LLAMA3 = ("{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
          "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
          "{%- else %}{%- set system_message = '' %}{%- endif %}"
          "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{{- 'Today Date: ' + date_string + '\\n\\n' }}{{- system_message }}{{- '<|eot_id|>' }}\n"
          "{%- for message in messages %}{%- if message.role not in ['user', 'assistant'] %}{{- raise_exception('Unknown role: ' + message.role) }}{%- endif %}"
          "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}\n"
          "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n")

def test_llama3_template():
  md = {**metadata("llama-bpe"), "tokenizer.chat_template": LLAMA3}
  t = ChatTemplate.from_metadata(md)
  assert t.render([{"role": "system", "content": " Be brief. "}, *MSGS], date_string="26 Jul 2024") == (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
  assert f"Today Date: {datetime.now():%d %b %Y}" in t.render(MSGS)  # strftime_now
  ids = tokenizer("llama-bpe").encode(t.render(MSGS), bos=False)  # the template writes BOS itself
  assert ids[:2] == [128000, 128006] and ids.count(128000) == 1 and ids[-4:] == [128006, 78191, 128007, 271]
  with pytest.raises(OrinError, match="Unknown role: tool"): t.render([{"role": "tool", "content": "x"}])

def test_fallback_chatml():
  t = ChatTemplate.from_metadata(metadata("llama-bpe"))  # this vocabulary file has no tokenizer.chat_template
  assert t.is_fallback and t.bos_token == "<|begin_of_text|>"
  assert t.render(MSGS) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"

def test_transformers_helpers():
  t = ChatTemplate("{% for m in messages %}{% generation %}{{ m | tojson }}{% endgeneration %}{% if loop.last %}{% break %}{% endif %}{% endfor %}")
  assert t.render([{"role": "user", "content": "café 中"}]) == '{"role": "user", "content": "café 中"}'

@pytest.mark.parametrize("src", [
  "{{ ''.__class__.__mro__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ cycler.__init__.__globals__.os }}",
  "{{ raise_exception.__globals__ }}", "{{ '{0.__class__}'.format(messages) }}", "{{ messages.append(1) }}", "{{ messages.pop() }}",
  "{{ 'x' * 100000000 }}", "{{ 10 ** 100000 }}",
])
def test_sandbox_escapes_raise(src):
  with pytest.raises(OrinError, match="chat template"): ChatTemplate(src).render(MSGS)

def test_template_errors_are_one_line():
  with pytest.raises(OrinError, match="does not compile") as e: ChatTemplate("{% for m in %}")
  assert "\n" not in str(e.value)
  with pytest.raises(OrinError, match="chat template: ") as e: ChatTemplate("{{ messages[3].content }}").render(MSGS)
  with pytest.raises(OrinError, match="chat template: nope"): ChatTemplate("{{ raise_exception('nope') }}").render(MSGS)
