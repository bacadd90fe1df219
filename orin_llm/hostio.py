"""Copies between the engine's run state on the device and the host, ordered with the steps queued on the device.

  upload(buf, start, values)  buf.flat[start:start+len(values)] = values, behind the steps queued so far
  fetch(buf, count)           buf.flat[:count] as it is once the steps queued so far have run; wait() returns it
  read(buf, count)            fetch and wait at once

With CudaHostIO, steps queued between fetch() and wait() run while the host waits: the engine queues the next decode
step before it reads this one's tokens, so the device does not idle while the host reads a token, runs the grammar and
queues the next step (a constrained request reads every token: docs/PERF.md, JSON schema); the server queues joining
prompts' step before it reads the first tokens of those before them. With HostIO the fetch itself waits.

HostIO goes through tinygrad's allocator (any device): its fetch copies at once, waiting for everything queued, and
each upload of the CUDA allocator takes a pinned buffer that is freed only at the next full synchronization.
CudaHostIO copies asynchronously through one pinned arena on the default stream, the one tinygrad queues its kernels
and graphs on, so that the copies keep their place among the steps; wait() waits on an event recorded after the
fetch's copy, not on the device.
"""
from __future__ import annotations
import ctypes
from dataclasses import dataclass
import numpy as np
from tinygrad import Tensor, Device
from tinygrad.dtype import _to_np_dtype
from orin_llm import log

def _view(buf: Tensor, start: int, count: int):
  """The device buffer of buf.flat[start:start+count] (buf realized)."""
  b = buf.uop.buffer
  return b.view(count, b.dtype, start * b.dtype.itemsize).ensure_allocated()

class HostIO:
  def __init__(self): self.pending = None  # what fetch() fetched (HostIO: the values; CudaHostIO: a _Fetch or the values)

  def upload(self, buf: Tensor, start: int, values: np.ndarray):
    """A plain host-to-device copy straight through the allocator. A slice assign would compile a kernel for each
    length and offset (a BEAM search inside a request for every new prompt length); Buffer.copy_from builds and runs
    a graph, 0.45 ms of host time a call."""
    v = _view(buf, start, len(values))
    assert values.dtype.itemsize == v.dtype.itemsize
    v.allocator._copyin(v._buf, memoryview(np.ascontiguousarray(values)).cast("B"))

  def fetch(self, buf: Tensor, count: int):
    """Copies at once: one copy straight from the allocator, which waits for everything queued (steps queued before
    wait() would otherwise write buf first). A Tensor slice's .numpy() schedules a copy kernel on every call: 2.4 ms of
    host time (tinygrad CPU)."""
    assert self.pending is None, "one fetch at a time"
    v = _view(buf, 0, count)
    out = np.empty(count, _to_np_dtype(v.dtype))
    v.allocator._copyout(memoryview(out).cast("B"), v._buf)
    self.pending = out

  def wait(self) -> np.ndarray:
    out, self.pending = self.pending, None
    return out

  def read(self, buf: Tensor, count: int) -> np.ndarray:
    self.fetch(buf, count)
    return self.wait()

@dataclass
class _Fetch:
  addr: int  # where in the arena
  count: int
  dtype: type
  used: int  # the arena's use after it

class CudaHostIO(HostIO):
  """Uploads and fetches take their host side from a pinned arena, in order; the arena is reused from its start once
  an event recorded after all of them has passed (each wait; or a full wait on the device when it fills up)."""
  ARENA = 1 << 20
  def __init__(self, device: str):
    super().__init__()
    from tinygrad.runtime.autogen import cuda
    from tinygrad.runtime.ops_cuda import check
    self.cuda, self.check, self.dev = cuda, check, Device[device]
    self._ctx()
    self.host = ctypes.c_void_p()
    check(cuda.cuMemHostAlloc(ctypes.byref(self.host), self.ARENA, 0x01))  # CU_MEMHOSTALLOC_PORTABLE
    self.event = cuda.CUevent()
    check(cuda.cuEventCreate(ctypes.byref(self.event), 0x2))  # CU_EVENT_DISABLE_TIMING
    self.used = 0  # bytes of the arena that copies queued since the last passed event may still read or write

  def _ctx(self): self.check(self.cuda.cuCtxSetCurrent(self.dev.context))

  def _take(self, nbytes: int) -> int:
    nbytes = (nbytes + 63) // 64 * 64
    if self.used + nbytes > self.ARENA:
      self.check(self.cuda.cuEventRecord(self.event, None))
      self.check(self.cuda.cuEventSynchronize(self.event))
      if isinstance(f := self.pending, _Fetch):  # a fetch waits (the server's prompts queued behind a first token's copy):
        out = np.empty(f.count, f.dtype)          # its copy has run; what it fetched is kept before the arena is reused
        ctypes.memmove(out.ctypes.data, f.addr, out.nbytes)
        self.pending = out
      self.used = 0
    addr, self.used = self.host.value + self.used, self.used + nbytes
    return addr

  def upload(self, buf: Tensor, start: int, values: np.ndarray):
    values = np.ascontiguousarray(values)
    if values.nbytes > self.ARENA // 4: return super().upload(buf, start, values)  # a long prompt: the allocator's copy
    self._ctx()
    v = _view(buf, start, len(values))
    assert values.dtype.itemsize == v.dtype.itemsize
    addr = self._take(values.nbytes)
    ctypes.memmove(addr, values.ctypes.data, values.nbytes)
    self.check(self.cuda.cuMemcpyHtoDAsync_v2(self.cuda.CUdeviceptr_v2(v._buf.value), ctypes.c_void_p(addr), values.nbytes, None))

  def fetch(self, buf: Tensor, count: int):
    assert self.pending is None, "one fetch at a time"
    self._ctx()
    v = _view(buf, 0, count)
    dtype = _to_np_dtype(v.dtype)
    nbytes = count * v.dtype.itemsize
    if nbytes > self.ARENA // 4: return super().fetch(buf, count)
    addr = self._take(nbytes)
    self.check(self.cuda.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(addr), self.cuda.CUdeviceptr_v2(v._buf.value), nbytes, None))
    self.check(self.cuda.cuEventRecord(self.event, None))
    self.pending = _Fetch(addr, count, dtype, self.used)

  def wait(self) -> np.ndarray:
    if not isinstance(f := self.pending, _Fetch): return super().wait()
    self.pending = None
    addr, count, dtype, used = f.addr, f.count, f.dtype, f.used
    self._ctx()
    self.check(self.cuda.cuEventSynchronize(self.event))
    out = np.empty(count, dtype)
    ctypes.memmove(out.ctypes.data, addr, out.nbytes)
    if self.used == used: self.used = 0  # the event follows every copy taken from the arena
    return out

def host_io(device: str) -> HostIO:
  """CudaHostIO on CUDA devices, else HostIO."""
  if device.split(":")[0] == "CUDA":
    try: return CudaHostIO(device)
    except Exception as e: log.info(f"no asynchronous host copies on {device} ({type(e).__name__}: {e}): the allocator's copies")
  return HostIO()
