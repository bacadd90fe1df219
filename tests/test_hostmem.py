"""hostmem: staging buffers fall back from reserved huge pages to THP to plain numpy, each one the
right size and writable, and the repacked planes are the same bytes whichever kind holds them.
System settings are never changed here: the huge-page test runs only where a pool is free already."""
import errno, mmap, re
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from orin_llm import hostmem
from orin_llm.quant import repack
from orin_llm.synth import random_blocks

MB = 1 << 20

def _mapping(addr: int) -> dict:
  """The /proc/self/smaps fields of the mapping holding addr."""
  lines = open("/proc/self/smaps").read().splitlines()
  for i, l in enumerate(lines):
    if m := re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", l):
      if int(m[1], 16) <= addr < int(m[2], 16):
        out = {}
        for f in lines[i + 1:]:
          if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", f): break
          k, _, v = f.partition(":"); out[k] = v.strip()
        return out
  raise LookupError(hex(addr))

def _check(a: np.ndarray, n: int):
  assert a.dtype == np.uint8 and a.shape == (n,) and a.flags.c_contiguous and a.flags.writeable
  if n: a[:] = 7; a[-1] = 9; assert a[-1] == 9 and (n == 1 or a[0] == 7)

@pytest.fixture
def no_hugetlb(monkeypatch):
  """A pool that claims to be free but whose mmap fails, as when another process took it first."""
  real = mmap.mmap
  def fake(*args, flags=0, **kw):
    if flags & hostmem.MAP_HUGETLB: raise OSError(errno.ENOMEM, "Cannot allocate memory")
    return real(*args, flags=flags, **kw)
  monkeypatch.setattr(hostmem.mmap, "mmap", fake)
  monkeypatch.setattr(hostmem, "free_huge_bytes", lambda: 1 << 40)
  monkeypatch.delenv(hostmem.ENV, raising=False)

@pytest.mark.parametrize("n", [0, 1, 4095, 3 * MB + 5, 8 * MB])
def test_sizes_any_mode(n, monkeypatch):
  for m in hostmem.MODES:
    monkeypatch.setenv(hostmem.ENV, m)
    _check(hostmem.empty(n), n)

def test_hugetlb_failure_falls_back(no_hugetlb):
  before = dict(hostmem.stats)
  a = hostmem.empty(5 * MB + 3)
  _check(a, 5 * MB + 3)
  assert hostmem.stats["hugetlb"] == before["hugetlb"]
  kind = "thp" if hostmem._thp_madvise() else "plain"
  assert hostmem.stats[kind] == before[kind] + 5 * MB + 3
  if kind == "thp":  # madvised and started on a huge page boundary
    assert "hg" in _mapping(a.ctypes.data)["VmFlags"].split()
    assert a.ctypes.data % hostmem.huge_page_size() == 0

def test_every_mmap_failing_gives_numpy(no_hugetlb, monkeypatch):
  def fail(*a, **k): raise OSError(errno.ENOMEM, "Cannot allocate memory")
  monkeypatch.setattr(hostmem.mmap, "mmap", fail)
  before = hostmem.stats["plain"]
  _check(hostmem.empty(4 * MB), 4 * MB)
  assert hostmem.stats["plain"] == before + 4 * MB

def test_off_and_bad_mode(monkeypatch):
  monkeypatch.setenv(hostmem.ENV, "off")
  before = hostmem.stats["plain"]
  hostmem.empty(4 * MB)
  assert hostmem.stats["plain"] == before + 4 * MB
  monkeypatch.setenv(hostmem.ENV, "yes")
  with pytest.raises(ValueError): hostmem.empty(4 * MB)

@pytest.mark.skipif(hostmem.free_huge_bytes() < 4 * MB, reason="no free huge pages (vm.nr_hugepages)")
def test_hugetlb_backed(monkeypatch):
  monkeypatch.delenv(hostmem.ENV, raising=False)
  before = hostmem.stats["hugetlb"]
  a = hostmem.empty(3 * MB)
  _check(a, 3 * MB)
  assert hostmem.stats["hugetlb"] == before + 3 * MB
  assert _mapping(a.ctypes.data)["KernelPageSize"] == f"{hostmem.huge_page_size() >> 10} kB"

@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0], ids=lambda q: q.name)
def test_repack_same_bytes_any_staging(qt, rng, monkeypatch, no_hugetlb):
  rows, cols = 1024, 2048  # over 1 MiB of planes: big enough for a huge page or THP buffer
  raw = random_blocks(rng, qt, rows * cols)
  got = {}
  for how in ("fallback", "off"):
    if how == "off": monkeypatch.setenv(hostmem.ENV, "off")
    got[how] = repack(raw, qt, rows, cols)
  monkeypatch.undo()  # the real mmap: huge pages where the pool has some
  got["auto"] = repack(raw, qt, rows, cols)
  for how, planes in got.items():
    assert planes.keys() == got["off"].keys()
    for k, v in planes.items():
      assert v.flags.c_contiguous and v.flags.writeable and v.shape[0] == rows
      np.testing.assert_array_equal(v, got["off"][k], err_msg=f"{how} {k}")

def test_server_config_key():
  from orin_llm.errors import OrinError
  from orin_llm.server.config import from_dict
  assert from_dict({"hugepages": "off"}).hugepages == "off" and from_dict({}).hugepages is None
  with pytest.raises(OrinError, match="hugepages"): from_dict({"hugepages": "yes"})
