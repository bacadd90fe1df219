#!/usr/bin/env python3
"""Runs an orin-llm command (the bench, usually) with the hand-coded opts of chosen kernels replaced, so that a kernel's
layout is judged by the time of the whole step it runs in. One kernel's time alone (scripts/mv_opts_bench.py) drifted
~10% from call to call, and one by one in the step (scripts/profile_decode.py, DEBUG=2) each kernel carries ~10 us of
synchronization: neither ranked the 1B's decode step (docs/PERF.md, twenty-ninth session: the gate+up in 64 lanes
within the spread alone, 5.8% slower in the step).
  python3 scripts/step_opts.py [--list] [--kernel SHAPE=OPTS ...] [--kernels FILE] [--min-blocks NAME=N ...] -- bench --model M --beam 0 ...
  python3 scripts/step_opts.py [...] -- scripts/spec_bench.py M --verify-only ...   (a script: a path ending in .py)
--list: print each kernel's shape before opts (the key --kernel takes) and the opts it got, to stderr.
--kernel SHAPE=OPTS: every kernel whose shape before opts is SHAPE (comma-separated sizes as --list prints them, `?` for
any size: a symbolic one; `r:` or `E:` first, as --list prints, takes only reductions or elementwise kernels) takes
OPTS (Scheduler.apply_opt's, e.g. UPCAST:0:2,LOCAL:0:4,GROUP:1:4; a tensor core's TC:0:-1/0/1) instead of the
heuristic's; a list that does not apply is an error, not a silent fallback. --kernels FILE: one SHAPE=OPTS a line
(scripts/searched_opts.py writes a BEAM ledger's searched layouts so; `#` begins a comment line). A key that no kernel
of the run took is named on stderr when the process ends. The overrides join the steps file's key
(MV_STEP_OPTS): a run with other overrides does not load this one's steps.
--min-blocks NAME=N: the CUDA kernel named NAME (its name after opts, as DEBUG=2 and render_kernels.py print it, e.g.
r_896_4_4_8_2_4_4_4_8_32) compiled with __launch_bounds__(threads, N): ptxas keeps it within the registers that let N
blocks share an SM (spilling if it must; render_kernels.py's source through `nvcc -Xptxas -v` shows both). Asks
whether a kernel that runs in more waves than its grid needs (the 8B's decode gate+up on an H100: 96 registers, 5
blocks of 128 threads an SM, 896 blocks: 1.36 waves of 660) gains from fitting one (docs/PERF.md, fiftieth session).
In the steps file's key too (MV_STEP_MIN_BLOCKS).
With --kernel or --min-blocks, BEAM must be 0: a search would start from the override and keep it in the BEAM database
under the kernel's own key. Kernels compile in this process (PARALLEL=0); `serve` and `prewarm` set PARALLEL from [beam] workers
again, so use it with `bench` or `generate`."""
import os, sys

def shape_key(shape) -> str:
  """A kernel's shape as --list prints it and --kernel matches it: ints as they are, a symbolic size as `?`."""
  return ",".join(str(d) if isinstance(d, int) else "?" for d in shape)

def opt_text(o) -> str:
  """Opt(UPCAST, 0, 2) -> UPCAST:0:2; a tensor core's tuple argument joined by `/` (TC:0:-1/0/1)."""
  arg = "/".join(str(x) for x in o.arg) if isinstance(o.arg, tuple) else o.arg
  return f"{o.op.name}:{o.axis}:{arg}"

def parse_opts(text: str) -> list:
  """UPCAST:0:2,LOCAL:0:4 -> [Opt(UPCAST, 0, 2), Opt(LOCAL, 0, 4)]; TC:0:-1/0/1 -> Opt(TC, 0, (-1, 0, 1))."""
  from tinygrad.codegen.opt import Opt, OptOps
  out = []
  for o in text.split(","):
    try:
      op, axis, arg = o.strip().split(":")
      out.append(Opt(OptOps[op], int(axis), tuple(int(x) for x in arg.split("/")) if "/" in arg else int(arg)))
    except (ValueError, KeyError): raise ValueError(f"{o.strip()!r} is not an opt (OP:AXIS:ARG, OP one of "
                                                    f"{', '.join(x.name for x in OptOps)})") from None
  return out

_matched: set = set()  # the override keys some kernel took: main() names the others when the process ends

def _name_unmatched(keys: list, out) -> None:
  if missed := [k for k in keys if k not in _matched]:
    print(f"step_opts: no kernel took {', '.join(missed)} (no kernel of the run has that kind and shape, or the run "
          "compiled none: its steps came from a cache)", file=out, flush=True)

def install(overrides: dict[str, str], listing: bool = False, out=sys.stderr) -> None:
  """Replace tinygrad's hand_coded_optimizations: a kernel whose shape_key is in overrides takes those opts."""
  import tinygrad.codegen.opt.heuristic as h
  orig = getattr(h.hand_coded_optimizations, "_orig", h.hand_coded_optimizations)
  parsed = {k: parse_opts(v) for k, v in overrides.items()}
  def hand_coded_optimizations(k):
    # the kind first (r: a reduction, E: elementwise, as tinygrad's names begin), as --list prints it: shapes alone
    # collide (r_512_2048, a norm's sum, and E_512_2048, its scaling, in one prefill chunk)
    key = f"{'r' if k.reduceops else 'E'}:{shape_key(k.full_shape)}"
    match = key if key in parsed else key[2:] if key[2:] in parsed else None
    if match is not None:
      _matched.add(match)
      nk = k.copy()
      for opt in parsed[match]: nk.apply_opt(opt)  # a KernelOptError propagates: the override is wrong, say so
      ret = nk
    else: ret = orig(k)
    if listing: print(f"step_opts: {key} {'override' if match is not None else 'heuristic'} "
                      f"{','.join(opt_text(o) for o in ret.applied_opts)}", file=out, flush=True)
    return ret
  hand_coded_optimizations._orig = orig
  h.hand_coded_optimizations = hand_coded_optimizations
  # tinygrad compiles a schedule's kernels in a pool of worker processes, started afresh (forkserver or spawn): they
  # would take the heuristic's opts, not these. Compiled here instead (PARALLEL=0; a BEAM search then runs here too)
  os.environ["PARALLEL"] = "0"
  from tinygrad import helpers
  helpers.PARALLEL.value = 0
  if overrides: os.environ["MV_STEP_OPTS"] = ";".join(f"{k}={v}" for k, v in sorted(overrides.items()))
  else: os.environ.pop("MV_STEP_OPTS", None)

_bounded: set = set()  # the kernel names --min-blocks gave and some rendered kernel had

def parse_bounds(spec: str) -> tuple[str, int]:
  """r_896_4_4_8_2_4_4_4_8_32=7 -> ("r_896_4_4_8_2_4_4_4_8_32", 7): a kernel's name and its blocks an SM, 1 to 32."""
  name, _, n = spec.partition("=")
  if not name.strip() or not n.strip().isdigit() or not 1 <= int(n) <= 32:
    raise ValueError(f"{spec!r}: NAME=N is needed, N a whole number of blocks an SM from 1 to 32")
  return name.strip(), int(n)

def install_bounds(bounds: dict[str, int]) -> None:
  """The CUDA renderer's source of a kernel named in bounds gets __launch_bounds__(threads, bounds[name]); the others
  are left as they are. tinygrad compiles that source (its compile cache keys by source, so the bounded kernel is a
  program of its own)."""
  import re
  from tinygrad.renderer.cstyle import CUDARenderer
  orig = getattr(CUDARenderer.render, "_orig", CUDARenderer.render)
  def render(self, *args, **kwargs):
    src = orig(self, *args, **kwargs)
    def bound(m):
      if m.group(2) not in bounds: return m.group(0)
      _bounded.add(m.group(2))
      return f"__launch_bounds__({m.group(1)}, {bounds[m.group(2)]}) {m.group(2)}("
    return re.sub(r"__launch_bounds__\((\d+)\) (\w+)\(", bound, src)
  render._orig = orig
  CUDARenderer.render = render
  if bounds: os.environ["MV_STEP_MIN_BLOCKS"] = ";".join(f"{k}={v}" for k, v in sorted(bounds.items()))
  else: os.environ.pop("MV_STEP_MIN_BLOCKS", None)

def main(argv: list[str]) -> None:
  if "--" not in argv: sys.exit(__doc__)
  ours, cmd = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  overrides, bounds, listing = {}, {}, False
  it = iter(ours)
  for a in it:
    if a == "--list": listing = True
    elif a in ("--kernel", "--kernels"):
      arg = next(it, None)
      if arg is None: sys.exit(f"step_opts: {a} needs an argument")
      try: specs = [arg] if a == "--kernel" else [s for s in open(arg).read().splitlines() if s.strip() and not s.lstrip().startswith("#")]
      except OSError as e: sys.exit(f"step_opts: --kernels {arg}: {e.strerror}")
      for spec in specs:
        if "=" not in spec: sys.exit(f"step_opts: {spec!r}: SHAPE=OPTS is needed")
        shape, opts = spec.split("=", 1)
        overrides[shape.replace(" ", "")] = opts.strip()
    elif a == "--min-blocks":
      arg = next(it, None)
      if arg is None: sys.exit("step_opts: --min-blocks needs NAME=N")
      try: name, n = parse_bounds(arg)
      except ValueError as e: sys.exit(f"step_opts: --min-blocks {e}")
      bounds[name] = n
    else: sys.exit(f"step_opts: unknown argument {a!r}\n{__doc__}")
  beam = os.environ.get("BEAM", "0")
  for i, a in enumerate(cmd):
    if a == "--beam" and i + 1 < len(cmd): beam = cmd[i + 1]
    elif a.startswith("--beam="): beam = a.split("=", 1)[1]
  if (overrides or bounds) and beam.strip() not in ("", "0"):
    sys.exit(f"step_opts: --kernel and --min-blocks need BEAM=0 (here {beam}): a search would start from the override and "
             "keep it in the BEAM database under the kernel's own key")
  try: install(overrides, listing)
  except ValueError as e: sys.exit(f"step_opts: --kernel/--kernels: {e}")
  install_bounds(bounds)
  import atexit
  atexit.register(_name_unmatched, list(overrides), sys.stderr)
  atexit.register(lambda: (missed := [k for k in bounds if k not in _bounded]) and print(
    f"step_opts: no kernel named {', '.join(missed)} was rendered (--min-blocks: no kernel of the run has that name, or "
    "the run rendered none: its steps came from a cache)", file=sys.stderr, flush=True))
  import runpy
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if cmd and cmd[0].endswith(".py"):  # a script (the verify steps' cost: spec_bench.py), run as `python3 SCRIPT ...` would
    sys.argv = cmd
    sys.path.insert(0, os.path.dirname(os.path.abspath(cmd[0])))
    runpy.run_path(cmd[0], run_name="__main__")
  else:
    sys.argv = ["orin_llm"] + cmd
    runpy.run_module("orin_llm", run_name="__main__")

if __name__ == "__main__": main(sys.argv[1:])
