"""0025-cuda-cubin: on the CUDA device, nvrtc writes CUBIN (the GPU's machine code) where a program is compiled, in the
worker pool of BEAM and of lower_and_compile; stock 0.14.0 asked it for PTX, which the driver turned into machine code
when the program was loaded, in the main process, one program at a time. Measured on an H200 (seventeenth session,
docs/PERF.md): `orin-llm prewarm --beam 0` of a 1B Q6_K, 70.7 s with PTX, 55.9 s with CUBIN. CUDA_CUBIN=0 gives PTX
again (a GPU newer than the nvrtc that compiles for it runs PTX only). Compiled programs are cached under the compiler's
key, so the two formats are kept apart. No GPU needed: the renderer is built with a stand-in for NVRTCCompiler (whose
constructor asks libnvrtc for its version)."""
import random
import pytest

@pytest.fixture
def made(monkeypatch):
  from tinygrad.runtime.support import compiler_cuda
  calls = []
  class Recorder:
    def __init__(self, arch, ptx=True, cache_key="cuda"): calls.append({"arch": arch, "ptx": ptx, "cache_key": cache_key})
  monkeypatch.setattr(compiler_cuda, "NVRTCCompiler", Recorder)
  def make(device: str, cubin: str | None):
    from tinygrad.helpers import Target, getenv
    from tinygrad.renderer.cstyle import CUDARenderer
    if cubin is None: monkeypatch.delenv("CUDA_CUBIN", raising=False)
    else: monkeypatch.setenv("CUDA_CUBIN", cubin)
    getenv.cache_clear()  # tinygrad caches each variable's first read
    arch = random.choice(["sm_87", "sm_90", "sm_89"])
    CUDARenderer(Target(device, "", arch))
    assert calls[-1]["arch"] == arch
    return calls[-1]
  yield make
  from tinygrad.helpers import getenv
  getenv.cache_clear()

def test_cuda_compiles_to_cubin_by_default(made):
  c = made("CUDA", None)
  assert c["ptx"] is False, "stock 0.14.0: PTX, compiled to machine code by the driver in the main process at each load"
  assert c["cache_key"] == "cuda_cubin"  # not the PTX programs' key: a cache of PTX never loads as CUBIN

def test_cuda_cubin_0_gives_ptx_as_before(made):
  c = made("CUDA", "0")
  assert c["ptx"] is True and c["cache_key"] == "cuda"

def test_nv_device_unchanged(made):
  # the NV backend's CUDA-C renderer already compiled to CUBIN, under its own key
  assert {k: v for k, v in made("NV", None).items() if k != "arch"} == {"ptx": False, "cache_key": "nv"}
