"""Per-kernel times of a function's kernels, each synchronized and timed alone (tinygrad's DEBUG=2 lines):
used by scripts/profile_decode.py."""
import contextlib, io, re
from collections import defaultdict
from tinygrad.helpers import Context

def kernel_times(fn, args: bool = False) -> list[tuple]:
  """Runs fn() under DEBUG=2 and returns (kernel name, us, GB/s) for each kernel it ran (args: and its buffer count)."""
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf), Context(DEBUG=2): fn()
  rows = []
  for line in re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue()).splitlines():
    m = re.match(r"\*\*\* \S+\s+\d+\s+(\S+)\s+arg\s+(\d+)\s+mem\s+[\d.]+ GB tm\s+([\d.]+)(us|ms|s)/.*?([\d.]+)\|([\d.]+)\s+GB/s", line)
    if m: rows.append((m.group(1), float(m.group(3)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(4)], float(m.group(6))) + ((int(m.group(2)),) * args))
  return rows

def print_table(rows, what: str, top: int = 25):
  total = sum(r[1] for r in rows)
  agg = defaultdict(lambda: [0, 0.0, 0.0])
  for name, us, gbs in rows: a = agg[name]; a[0] += 1; a[1] += us; a[2] += us * gbs
  print(f"{len(rows)} kernels, {total:.0f} us of kernel time in {what} (each kernel timed alone)")
  print(f"{'kernel':48s} {'n':>4s} {'us total':>9s} {'%':>5s} {'GB/s':>7s}")
  for name, (n, us, w) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"{name:48s} {n:4d} {us:9.1f} {100 * us / total:5.1f} {w / us if us else 0:7.0f}")

def print_compare(runs, what: str, top: int = 25):
  """runs: pairs (base, searched) of kernel_times of the same step with the hand-coded opts and with searched ones,
  each pair's kernels paired as below and each kernel's least time over the runs kept. The kernels run
  in the same order either way (opts change a kernel's name, not the schedule), but a step run again can add a few
  (assigns of earlier calls): paired by aligning the sequences on what opts do not change (elementwise or reduce, the
  buffer count; kernel_times(args=True)), summed by the hand-coded kernel's name, sorted by what the search gains."""
  import difflib
  sig = lambda rows: [(r[0][0], r[3]) for r in rows]
  def paired(base, searched):
    blocks = difflib.SequenceMatcher(None, sig(base), sig(searched), autojunk=False).get_matching_blocks()
    pairs = [(base[b.a + i], searched[b.b + i]) for b in blocks for i in range(b.size)]
    if len(pairs) < max(len(base), len(searched)): print(f"({len(base)} kernels hand-coded, {len(searched)} searched: {len(pairs)} paired)")
    return pairs
  pairs = paired(*runs[0])
  for more in runs[1:]:
    p2 = paired(*more)
    if len(p2) != len(pairs): print("(a run paired differently: not used)"); continue
    pairs = [tuple((x[0], min(x[1], y[1]), *x[2:]) for x, y in zip(p, q)) for p, q in zip(pairs, p2)]
  base, searched = [p[0] for p in pairs], [p[1] for p in pairs]
  tb, ts = sum(r[1] for r in base), sum(r[1] for r in searched)
  agg = defaultdict(lambda: [0, 0.0, 0.0, ""])
  for (name, us, *_), (sname, sus, *_) in zip(base, searched):
    a = agg[name]; a[0] += 1; a[1] += us; a[2] += sus; a[3] = sname
  print(f"{len(base)} kernels in {what}: {tb:.0f} us hand-coded, {ts:.0f} us searched ({100 * (tb - ts) / tb:+.1f}% of the step), each timed alone")
  print(f"{'kernel (hand-coded)':44s} {'n':>4s} {'us hand':>8s} {'us srch':>8s} {'gain us':>8s} {'% step':>6s}  searched as")
  for name, (n, us, sus, sname) in sorted(agg.items(), key=lambda kv: -(kv[1][1] - kv[1][2]))[:top]:
    print(f"{name:44s} {n:4d} {us:8.1f} {sus:8.1f} {us - sus:8.1f} {100 * (us - sus) / tb:6.1f}  {sname}")
  lost = sorted(agg.items(), key=lambda kv: kv[1][1] - kv[1][2])[:5]
  print("largest losses: " + ", ".join(f"{k} {v[1] - v[2]:+.1f} us" for k, v in lost if v[1] < v[2]))
