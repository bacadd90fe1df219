"""orin_llm: GGUF language models decoded by a patched tinygrad, weights kept quantized on the device."""
__version__ = "0.1.0"
