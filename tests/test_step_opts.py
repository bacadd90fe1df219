"""scripts/step_opts.py: a kernel's hand-coded opts replaced by its shape before opts, the others left to the heuristic,
a list that does not apply refused. A Q6_K product and a Q4_K one rendered for an sm_87 CUDA renderer on the CPU, in a
subprocess (the override replaces a tinygrad function for the whole process)."""
import json, os, subprocess, sys, textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = textwrap.dedent('''
  import io, json, os, sys
  import numpy as np
  sys.path.insert(0, sys.argv[1])
  import step_opts
  from gguf import GGMLQuantizationType as QT
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  from orin_llm.quant import QuantWeight, empty_planes
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  def opts(O, K, qt):
    planes = empty_planes(qt, O, K, "CPU")
    y = QuantWeight(qt, O, K, planes)(Tensor.empty(1, K, device="CPU"))
    sinks = [full_rewrite_to_sink(c.src[0], ren) for c in y.linear_with_vars()[0].src if c.src[0].op is Ops.SINK]
    return [[f"{o.op.name}:{o.axis}:{o.arg}" for o in s.arg.applied_opts] for s in sinks]
  listing = io.StringIO()
  step_opts.install({}, listing=True, out=listing)
  before6, before4 = opts(2048, 4096, QT.Q6_K), opts(1024, 2048, QT.Q4_K)
  keys = [l.split()[1] for l in listing.getvalue().splitlines()]
  override = "LOCAL:0:2,UNROLL:0:0,UNROLL:0:0,GROUP:1:4,GROUP:0:16"
  step_opts.install({keys[0]: override})
  after6, after4, env = opts(2048, 4096, QT.Q6_K), opts(1024, 2048, QT.Q4_K), os.environ.get("MV_STEP_OPTS")
  step_opts.install({"E" + keys[0][1:]: override})  # the shape with the other kind: an elementwise kernel's key
  wrong_kind = opts(2048, 4096, QT.Q6_K)
  step_opts.install({keys[0][2:]: override})  # the shape alone: either kind
  plain = opts(2048, 4096, QT.Q6_K)
  step_opts.install({keys[0]: "UPCAST:0:3"})  # 3 does not divide the rows
  try: opts(2048, 4096, QT.Q6_K); refused = False
  except Exception as e: refused = type(e).__name__
  # a schedule of several kernels: tinygrad compiles them in worker processes unless PARALLEL=0 (install sets it)
  w = QuantWeight.from_raw(np.random.default_rng().integers(0, 256, size=256 * 512 // 256 * 210, dtype=np.uint8), QT.Q6_K, 256, 512, "CPU")
  x = Tensor(np.random.default_rng().normal(size=(1, 512)).astype(np.float32), device="CPU").realize()
  listing = io.StringIO()  # (listed from here: only the schedule below, not the weight's and input's own)
  step_opts.install({}, listing=True, out=listing)
  Tensor.realize(w(x) + 1, (w(x) * 2).sum())
  realized = len(listing.getvalue().splitlines())
  print(json.dumps({"realized": realized, "keys": keys, "before6": before6, "before4": before4, "after6": after6, "after4": after4,
                    "override": override, "env": env, "refused": refused, "wrong_kind": wrong_kind, "plain": plain}))
''')

def test_override_by_shape():
  env = {"ORIN_LLM_AFFINE": "1", "DEV": "CPU", "PARALLEL": "4"}
  r = subprocess.run([sys.executable, "-c", RUN, str(ROOT / "scripts")], capture_output=True, text=True, cwd=ROOT,
                     env={k: v for k, v in os.environ.items() if not k.startswith(("MV_", "BEAM"))} | env, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  d = json.loads(r.stdout.strip().splitlines()[-1])
  assert len(d["keys"]) == 2 and d["keys"][0] != d["keys"][1]  # one product kernel each, told apart by shape
  assert d["keys"][0].startswith("r:2048,")  # a reduction's kind, then its shape
  [h6], [h4] = d["before6"], d["before4"]
  assert h6 != d["override"].split(",")  # the heuristic's own (0039: 32 lanes)
  assert d["after6"] == [d["override"].split(",")]  # replaced
  assert d["after4"] == [h4]  # the other kernel keeps the heuristic's
  assert d["wrong_kind"] == [h6] and d["plain"] == [d["override"].split(",")]
  assert d["env"] == f"{d['keys'][0]}={d['override']}"  # in the steps file's key (MV_*)
  assert d["refused"] == "KernelOptError"
  assert d["realized"] >= 2  # the realized kernels' opts were chosen in this process, where the replacement is

def test_usage_without_a_command():
  r = subprocess.run([sys.executable, ROOT / "scripts/step_opts.py", "--list"], capture_output=True, text=True, timeout=60)
  assert r.returncode != 0 and "step_opts.py [--list]" in r.stderr

def test_refuses_a_search_and_a_wrong_opt():
  run = lambda *a, **env: subprocess.run([sys.executable, ROOT / "scripts/step_opts.py", *a], capture_output=True, text=True,
                                         timeout=60, env={**{k: v for k, v in os.environ.items() if k != "BEAM"}, **env})
  r = run("--kernel", "16,2=UPCAST:0:2", "--", "bench", "--beam", "2")
  assert r.returncode != 0 and "need BEAM=0 (here 2)" in r.stderr
  r = run("--kernel", "16,2=UPCAST:0:2", "--", "bench", BEAM="1")
  assert r.returncode != 0 and "need BEAM=0 (here 1)" in r.stderr
  r = run("--kernel", "16,2=UPCST:0:2", "--", "bench", "--beam", "0")
  assert r.returncode != 0 and "'UPCST:0:2' is not an opt" in r.stderr
  r = run("--min-blocks", "r_16_2=4", "--", "bench", "--beam", "2")
  assert r.returncode != 0 and "need BEAM=0 (here 2)" in r.stderr
  for bad in ("r_16_2", "r_16_2=0", "r_16_2=33", "=4", "r_16_2=x"):  # NAME=N, N from 1 to 32
    r = run("--min-blocks", bad, "--", "bench", "--beam", "0")
    assert r.returncode != 0 and "step_opts: --min-blocks" in r.stderr and "NAME=N" in r.stderr, (bad, r.stderr)

def test_runs_a_script(tmp_path):
  """`-- SCRIPT.py ARGS`: the script runs as `python3 SCRIPT.py ARGS` would (its own argv, its directory importable),
  with the overrides installed in its process."""
  (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
  (tmp_path / "s.py").write_text(textwrap.dedent('''
    import json, os, sys
    import helper_mod
    import tinygrad.codegen.opt.heuristic as h
    print(json.dumps({"argv": sys.argv, "value": helper_mod.VALUE, "installed": hasattr(h.hand_coded_optimizations, "_orig"),
                      "env": os.environ.get("MV_STEP_OPTS"), "main": __name__}))
  '''))
  r = subprocess.run([sys.executable, ROOT / "scripts/step_opts.py", "--kernel", "r:16,2=UPCAST:0:2", "--",
                      str(tmp_path / "s.py"), "a", "--b"], capture_output=True, text=True, timeout=120,
                     env={k: v for k, v in os.environ.items() if not k.startswith(("MV_", "BEAM"))} | {"DEV": "CPU"})
  assert r.returncode == 0, r.stderr[-3000:]
  d = json.loads(r.stdout.strip().splitlines()[-1])
  assert d == {"argv": [str(tmp_path / "s.py"), "a", "--b"], "value": 7, "installed": True, "env": "r:16,2=UPCAST:0:2",
               "main": "__main__"}
  assert "no kernel took r:16,2" in r.stderr  # nothing compiled: the key is named when the process ends

BOUNDS = textwrap.dedent('''
  import json, os, re, sys
  sys.path.insert(0, sys.argv[1])
  import step_opts
  from render_kernels import render
  from gguf import GGMLQuantizationType as QT
  from tinygrad import Tensor
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  from orin_llm.quant import QuantWeight, empty_planes
  ren = CUDARenderer(Target("CUDA", "", "sm_90"), use_nvcc=True)
  def sources():
    ys = [QuantWeight(qt, O, K, empty_planes(qt, O, K, "CPU"))(Tensor.empty(1, K, device="CPU")) for qt, O, K in ((QT.Q4_K, 1024, 2048), (QT.Q6_K, 2048, 4096))]
    return [render(c.src[0], ren)[2] for y in ys for c in y.linear_with_vars()[0].src if c.src[0].op is Ops.SINK]
  bounds = lambda srcs: [re.search(r"__launch_bounds__\\(([0-9, ]+)\\) (\\w+)\\(", s).groups() for s in srcs]
  before = bounds(sources())
  step_opts.install_bounds({before[0][1]: 7})
  after, env = bounds(sources()), os.environ.get("MV_STEP_MIN_BLOCKS")
  step_opts.install_bounds({})  # again: the renderer's own, nothing bounded
  plain = bounds(sources())
  print(json.dumps({"before": before, "after": after, "env": env, "plain": plain, "unset": os.environ.get("MV_STEP_MIN_BLOCKS")}))
''')

def test_min_blocks_bounds_the_named_kernel_only():
  """--min-blocks NAME=N: the named kernel's CUDA source gets __launch_bounds__(threads, N), the other kernel keeps the
  renderer's own; the bounds are in the steps file's key (MV_STEP_MIN_BLOCKS) and installing none restores the source."""
  env = {"ORIN_LLM_AFFINE": "1", "DEV": "CPU"}
  r = subprocess.run([sys.executable, "-c", BOUNDS, str(ROOT / "scripts")], capture_output=True, text=True, cwd=ROOT,
                     env={k: v for k, v in os.environ.items() if not k.startswith(("MV_", "BEAM"))} | env, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  d = json.loads(r.stdout.strip().splitlines()[-1])
  (t0, n0), (t1, n1) = d["before"]
  assert n0 != n1 and "," not in t0 and "," not in t1  # two kernels, each with its threads alone
  assert d["after"] == [[f"{t0}, 7", n0], [t1, n1]]
  assert d["env"] == f"{n0}=7" and d["plain"] == d["before"] and d["unset"] is None
