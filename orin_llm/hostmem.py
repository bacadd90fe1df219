"""Host staging buffers (repacked planes, planes read from the cache) in huge pages where the system has them.

`empty(n)` tries, in order: a MAP_HUGETLB mapping from the pool that `vm.nr_hugepages` reserves
(services.orin-llm.hugepages), an anonymous mapping advised MADV_HUGEPAGE (transparent huge pages,
when /sys/kernel/mm/transparent_hugepage/enabled allows madvise), plain numpy. MAP_HUGETLB pages are
reserved at mmap time, so a pool too small for one buffer fails that mmap with ENOMEM and only that
buffer falls back. What huge pages save is page faults and TLB misses while the buffers are first
written and then copied out; see README.md for what that measured to."""
from __future__ import annotations
import ctypes, mmap, os
import numpy as np
from orin_llm import log

ENV = "ORIN_LLM_HUGEPAGES"   # auto | off; the server's `hugepages` key sets it
MODES = ("auto", "off")
MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)  # Python 3.11's mmap does not export it; same value on x86-64 and arm64
stats = {"hugetlb": 0, "thp": 0, "plain": 0}  # bytes handed out per kind, since import
_logged: set[str] = set()

def mode() -> str:
  m = os.environ.get(ENV, "auto").strip().lower() or "auto"  # read per call: the server sets it from its config
  if m not in MODES: raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, not {m!r}")
  return m

def _meminfo(key: str) -> int | None:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        k, _, v = line.partition(":")
        if k == key: return int(v.split()[0]) * (1024 if v.strip().endswith("kB") else 1)
  except (OSError, ValueError): pass
  return None

def huge_page_size() -> int: return _meminfo("Hugepagesize") or 2 << 20

def free_huge_bytes() -> int: return (_meminfo("HugePages_Free") or 0) * huge_page_size()

def _thp_madvise() -> bool:
  try: s = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
  except OSError: return False
  return "[never]" not in s

def _once(kind: str, msg: str):
  if kind not in _logged: _logged.add(kind); log.info(msg)

def _view(mm: mmap.mmap, nbytes: int, align: int = 1) -> np.ndarray:
  # the array's base chain holds the mapping: it is unmapped when the last view goes
  off = -ctypes.addressof(ctypes.c_char.from_buffer(mm)) % align if align > 1 else 0
  return np.frombuffer(mm, np.uint8, nbytes, off)

def empty(nbytes: int) -> np.ndarray:
  """An uninitialized, writable, C-contiguous uint8 array of nbytes."""
  if nbytes <= 0 or mode() == "off": return _plain(nbytes)
  hp = huge_page_size()
  if nbytes >= hp // 2:  # smaller ones would waste most of a huge page
    size = -(-nbytes // hp) * hp
    if free_huge_bytes() >= size:  # cheap pre-check; the mmap itself is the real test (another process may race us)
      try:
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
        stats["hugetlb"] += nbytes
        _once("hugetlb", f"host staging: huge pages ({hp >> 10} kB) from the reserved pool, first buffer {nbytes / 2**20:.1f} MiB")
        return _view(mm, nbytes)
      except OSError as e:
        _once("hugetlb-fail", f"host staging: huge page mmap of {size / 2**20:.0f} MiB failed ({e.strerror or e}): falling back")
    else: _once("hugetlb-none", f"host staging: {free_huge_bytes() // hp} huge pages free, {nbytes / 2**20:.1f} MiB wanted: falling back")
    if _thp_madvise():
      try:
        mm = mmap.mmap(-1, nbytes + hp, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE)  # the kernel backs aligned 2 MiB ranges with huge pages when it has them
        stats["thp"] += nbytes
        _once("thp", f"host staging: transparent huge pages (madvise), first buffer {nbytes / 2**20:.1f} MiB")
        return _view(mm, nbytes, hp)  # start on a huge page boundary, or the first and last ranges stay 4 kB pages
      except (OSError, ValueError) as e:
        _once("thp-fail", f"host staging: MADV_HUGEPAGE failed ({e}): plain pages")
  return _plain(nbytes)

def arrays(specs: dict[str, tuple[tuple[int, ...], "np.dtype"]]) -> dict[str, np.ndarray]:
  """Name -> an uninitialized array of (shape, dtype), all views of one buffer from empty() (64-byte aligned each):
  one mapping per tensor's planes, so each falls back on its own, freed with its last view."""
  offs, total = {}, 0
  for name, (shape, dt) in specs.items():
    offs[name] = total
    total += -(-int(np.prod(shape)) * np.dtype(dt).itemsize // 64) * 64
  buf = empty(total)
  return {name: buf[offs[name]:offs[name] + int(np.prod(shape)) * np.dtype(dt).itemsize].view(dt).reshape(shape)
          for name, (shape, dt) in specs.items()}

def _plain(nbytes: int) -> np.ndarray:
  stats["plain"] += max(nbytes, 0)
  return np.empty(max(nbytes, 0), np.uint8)

def summary(since: dict | None = None) -> str:
  """Bytes per kind handed out since the snapshot `since` (a copy of stats)."""
  d = {k: v - (since or {}).get(k, 0) for k, v in stats.items()}
  return ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in d.items() if v) or "nothing"
