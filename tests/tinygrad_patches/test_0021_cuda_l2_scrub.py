"""0021-cuda-l2-scrub: the CUDA device has invalidate_caches, so time_call(clear_l2=True) and BEAM (which passes
clear_l2=hasattr(dev, 'invalidate_caches')) time a kernel with a cold L2. It reads (never writes) twice the L2's size,
the size queried once from the driver, from a buffer of ones made once. Runs without a GPU or libcuda: a CUDADevice
built without its constructor, whose device name is CPU, so the read runs on tinygrad's CPU backend; the two driver
calls are stubs."""
import ctypes, random

def test_cuda_device_reads_twice_its_l2(monkeypatch):
  from tinygrad.runtime import ops_cuda
  from tinygrad.runtime.autogen import cuda
  l2 = random.choice([1, 2, 3, 4]) << 20  # (an Orin's is 4 MiB, an H100's 50)
  asked = []
  def attr(out, which, dev):
    asked.append((which, dev))
    ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = l2 if which == cuda.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE else -1
    return 0
  monkeypatch.setattr(cuda, "cuDeviceGetAttribute", attr, raising=False)
  monkeypatch.setattr(cuda, "cuCtxSetCurrent", lambda ctx: 0, raising=False)
  dev = object.__new__(ops_cuda.CUDADevice)
  dev.context, dev.cu_device, dev.device = object(), 7, "CPU"
  assert hasattr(dev, "invalidate_caches"), "stock 0.14.0: the CUDA device has no invalidate_caches, BEAM times it with a warm L2"

  for _ in range(3): dev.invalidate_caches()
  assert asked == [(cuda.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 7)]  # once
  scrub = dev._l2_scrub
  assert scrub.nbytes() == 2 * l2 and scrub.device == "CPU"
  assert int(scrub.min().item()) == 1 == int(scrub.max().item())  # ones (not zeros, which a GPU may keep compressed), unchanged: only read

def test_time_call_clears_cuda_l2():
  """what BEAM checks to decide whether to clear: the CUDA device class now qualifies"""
  from tinygrad.runtime.ops_cuda import CUDADevice
  assert callable(getattr(CUDADevice, "invalidate_caches", None))
