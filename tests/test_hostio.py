"""hostio.CudaHostIO's pinned arena without a GPU: the CUDA driver calls it makes are stood in for by copies between
numpy arrays (a copy "queued" runs at once; an event has always passed), which is enough to test its bookkeeping: each
copy takes its own part of the arena, a fetch returns what the buffer held when it was fetched, and an arena that
fills up while a fetch waits keeps what that fetch read (the server queues prompts behind a first token's copy)."""
import ctypes
import numpy as np
from tinygrad import dtypes
from orin_llm import hostio

class FakeCuda:
  CUdeviceptr_v2 = ctypes.c_void_p
  CUevent = ctypes.c_void_p
  def __init__(self): self.syncs = 0
  def cuCtxSetCurrent(self, ctx): return 0
  def cuMemcpyHtoDAsync_v2(self, dst, src, n, stream): ctypes.memmove(dst.value, src.value, n); return 0
  def cuMemcpyDtoHAsync_v2(self, dst, src, n, stream): ctypes.memmove(dst.value, src.value, n); return 0
  def cuEventRecord(self, event, stream): return 0
  def cuEventSynchronize(self, event): self.syncs += 1; return 0

class View:
  """What hostio._view gives: a device buffer's part (here a numpy array's)."""
  def __init__(self, arr: np.ndarray, start: int, count: int):
    self.dtype, self.arr = dtypes.int32, arr
    self._buf = ctypes.c_void_p(arr.ctypes.data + start * 4)

def make_io(monkeypatch, arena: int):
  io = object.__new__(hostio.CudaHostIO)
  hostio.HostIO.__init__(io)
  pinned = np.zeros(arena, np.uint8)
  monkeypatch.setattr(hostio.CudaHostIO, "ARENA", arena)
  monkeypatch.setattr(hostio, "_view", lambda buf, start, count: View(buf, start, count))
  io.cuda, io.check, io.dev, io.host, io.event, io.used = FakeCuda(), lambda r: None, type("D", (), {"context": None})(), ctypes.c_void_p(pinned.ctypes.data), None, 0
  io._pinned = pinned  # kept alive
  return io

def test_uploads_and_fetches_keep_their_values(monkeypatch, rng):
  io = make_io(monkeypatch, 1 << 12)
  dev = np.zeros(64, np.int32)
  for _ in range(50):  # many more than the arena holds: it is reused from its start
    vals = rng.integers(-1 << 30, 1 << 30, int(rng.integers(1, 16))).astype(np.int32)
    start = int(rng.integers(0, 64 - len(vals) + 1))
    io.upload(dev, start, vals)
    assert (dev[start:start + len(vals)] == vals).all()
    n = int(rng.integers(1, 65))
    assert (io.read(dev, n) == dev[:n]).all()

def test_an_arena_that_fills_while_a_fetch_waits_keeps_what_it_fetched(monkeypatch, rng):
  """A fetch, then uploads that fill the arena before its wait (the buffer fetched overwritten on the 'device' by
  them, as a later step writes next_tok): wait() returns the values at the fetch. Before, _take asserted."""
  io = make_io(monkeypatch, 1 << 10)
  dev = rng.integers(0, 1 << 20, 8).astype(np.int32)
  want = dev.copy()
  io.fetch(dev, 8)
  for _ in range(40):  # 40 uploads of 64 bytes (rounded) each: past the 1 KiB arena more than once
    io.upload(dev, 0, rng.integers(0, 1 << 20, 8).astype(np.int32))
  assert io.cuda.syncs >= 2 and not (dev == want).all()
  assert (io.wait() == want).all()
