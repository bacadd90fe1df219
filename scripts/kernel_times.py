"""Per-kernel times of a function's kernels, each synchronized and timed alone (tinygrad's DEBUG=2 lines):
used by scripts/profile_decode.py."""
import contextlib, io, re
from collections import defaultdict
from tinygrad.helpers import Context

def kernel_times(fn) -> list[tuple[str, float, float]]:
  """Runs fn() under DEBUG=2 and returns (kernel name, us, GB/s) for each kernel it ran."""
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf), Context(DEBUG=2): fn()
  rows = []
  for line in re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()).splitlines():
    m = re.match(r"\*\*\* \S+\s+\d+\s+(\S+)\s+arg\s+\d+\s+mem\s+[\d.]+ GB tm\s+([\d.]+)(us|ms|s)/.*?([\d.]+)\|([\d.]+)\s+GB/s", line)
    if m: rows.append((m.group(1), float(m.group(2)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(3)], float(m.group(5))))
  return rows

def print_table(rows, what: str, top: int = 25):
  total = sum(r[1] for r in rows)
  agg = defaultdict(lambda: [0, 0.0, 0.0])
  for name, us, gbs in rows: a = agg[name]; a[0] += 1; a[1] += us; a[2] += us * gbs
  print(f"{len(rows)} kernels, {total:.0f} us of kernel time in {what} (each kernel timed alone)")
  print(f"{'kernel':48s} {'n':>4s} {'us total':>9s} {'%':>5s} {'GB/s':>7s}")
  for name, (n, us, w) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"{name:48s} {n:4d} {us:9.1f} {100 * us / total:5.1f} {w / us if us else 0:7.0f}")
