"""From a GGUF file to device tensors: matrices repacked into quantized planes, vectors as float32."""
from __future__ import annotations
import time
import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor, Device
from orin_llm.config import ModelConfig, config_from_gguf
from orin_llm.gguf_file import GGUFFile
from orin_llm.quant import QuantWeight
from orin_llm import log

def load_weights(f: GGUFFile, cfg: ModelConfig, device: str) -> dict:
  out = {}
  names = list(cfg.tensor_shapes())
  t0 = time.monotonic()
  for n, name in enumerate(names):
    info, raw = f.tensors[name], f.raw(name)
    if len(info.shape) == 1:  # norms and rope factors: small, kept as float32
      vals = raw.reshape(-1).view(np.float32) if info.qtype == QT.F32 else gguf.quants.dequantize(np.asarray(raw).reshape(-1), info.qtype)
      out[name] = Tensor(np.array(vals, dtype=np.float32), device=device).realize()
    else:
      out[name] = QuantWeight.from_raw(raw, info.qtype, info.shape[0], info.shape[1], device)
      Tensor.realize(*out[name].planes.values())
    log.progress("loading weights", n + 1, len(names), t0)
  return out

def open_model(path) -> tuple[GGUFFile, ModelConfig]:
  f = GGUFFile(path)
  return f, config_from_gguf(f)

def default_device() -> str: return Device.DEFAULT
