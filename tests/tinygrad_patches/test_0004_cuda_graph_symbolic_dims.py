"""0004-cuda-graph-symbolic-dims: CUDAGraph creates each kernel node with its launch dims at every
variable 0; a grid that is a symbolic chunk length T (1..32) was then 0 and cuGraphAddKernelNode failed
with "CUDA Error 1, invalid argument". Patched, the node is created with every dim at least 1 and the
real dims are set before each launch.

Runs without a GPU or libcuda: a TinyJit over a symbolic T runs on tinygrad's CUDA-flavoured emulator
(DEV=PYTHON::sm_80, which renders kernels with CUDA launch dims) with tinygrad's real CUDAGraph as the
device's graph; the CUDA driver calls CUDAGraph makes are replaced by fakes that record the kernel node
params and answer CUDA_ERROR_INVALID_VALUE (1), as the driver does, for a grid or block dim of 0. The fake
cuGraphLaunch runs each node's program on the emulator with the dims and arguments the node holds then,
so the results check that the dims CUDAGraph sets before a launch are the real ones."""
import json, os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import ctypes, json, types
  import numpy as np
  from tinygrad import Tensor, TinyJit, Device, UOp
  import tinygrad.runtime.autogen.cuda as cuda
  import tinygrad.runtime.graph.cuda as graph_cuda
  from tinygrad.runtime.graph.cuda import CUDAGraph
  from tinygrad.runtime.ops_python import PythonProgram

  def dims(p): return [p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ]
  def kernel_params(pp): return ctypes.cast(pp, ctypes.POINTER(cuda.CUDA_KERNEL_NODE_PARAMS_v1)).contents
  log = {"created": [], "launched": [], "symbolic_zero_dims": [], "results": []}
  current: list = []

  def cuGraphAddKernelNode(node, graph, deps, ndeps, pparams):
    log["created"].append(d := dims(kernel_params(pparams)))
    return 1 if 0 in d else 0  # CUDA_ERROR_INVALID_VALUE
  def cuGraphExecKernelNodeSetParams(instance, node, pparams): return 1 if 0 in dims(kernel_params(pparams)) else 0
  def cuGraphLaunch(instance, stream):
    g = current[-1]
    for (_, params, c_args, is_copy), (_, ast, _, _), runtime in zip(g.nodes, g.calls, g.runtimes):
      assert not is_copy
      log["launched"].append(d := dims(params))
      runtime(*[getattr(c_args, f"f{i}") for i in range(len(ast.arg.globals))], global_size=tuple(d[:3]), local_size=tuple(d[3:]),
              vals=tuple(getattr(c_args, f"v{i}") for i in range(len(ast.arg.vars))))
    return 0
  _msg = ctypes.create_string_buffer(b"invalid argument")
  def cuGetErrorString(status, pstr):
    ctypes.c_void_p.from_address(ctypes.addressof(pstr._obj)).value = ctypes.addressof(_msg)
    return 0
  for name, fn in {"cuGraphCreate": lambda *a: 0, "cuGraphAddKernelNode": cuGraphAddKernelNode, "cuGraphInstantiate_v2": lambda *a: 0,
                   "cuGraphExecKernelNodeSetParams": cuGraphExecKernelNodeSetParams, "cuGraphLaunch": cuGraphLaunch,
                   "cuGraphDestroy": lambda *a: 0, "cuGraphExecDestroy": lambda *a: 0, "cuGetErrorString": cuGetErrorString}.items():
    setattr(cuda, name, fn)
  # kernel arguments stay Python objects (the emulator's buffers are memoryviews, not device pointers)
  def encode_args(args, vals, signature):
    return types.SimpleNamespace(**{f"f{i}": a for i, a in enumerate(args)}, **{f"v{i}": v for i, v in enumerate(vals)}), None
  graph_cuda.encode_args = encode_args

  class Graph(CUDAGraph):
    def __init__(self, *args, **kwargs):
      try: super().__init__(*args, **kwargs)
      finally: log["symbolic_zero_dims"] += [0 in ast.arg.launch_dims({"T": 0})[0] for (_, ast, _, _) in self.calls]
    def __call__(self, *args, **kwargs):
      current.append(self)
      return super().__call__(*args, **kwargs)
  PythonProgram.prg, PythonProgram.smem, PythonProgram.signature = cuda.CUfunction(), 0, None  # what CUDAGraph reads off a CUDAProgram
  Device["PYTHON"].graph = Graph

  T = UOp.variable("T", 1, 32)
  a = Tensor.arange(32 * 8, dtype="float32").reshape(32, 8).contiguous().realize()
  o, p = Tensor.zeros(32, 8).contiguous().realize(), Tensor.zeros(32, 8).contiguous().realize()
  @TinyJit
  def step(n):
    o[:n].assign(a[:n] + 1).realize()
    p[:n].assign(o[:n] * 2).realize()
  for t in (3, 5, 7, 2, 32, 1):
    p.assign(Tensor.zeros(32, 8)).realize()
    step(T.bind(t))
    want = np.zeros((32, 8), np.float32)
    want[:t] = (np.arange(32 * 8, dtype=np.float32).reshape(32, 8)[:t] + 1) * 2
    log["results"].append(bool((p.numpy() == want).all()))
  print(json.dumps(log))
""")

def test_symbolic_grid_graph():
  env = {**os.environ, "DEV": "PYTHON::sm_80", "JIT": "1"}
  r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  log = json.loads(r.stdout.splitlines()[-1])
  # the test exercises the bug: the graph holds kernels whose grid is 0 with T at 0
  assert log["symbolic_zero_dims"] and all(log["symbolic_zero_dims"]), log
  assert log["created"] and all(min(d) >= 1 for d in log["created"]), log["created"]
  assert log["launched"] and all(min(d) >= 1 for d in log["launched"]), log["launched"]
  assert log["results"] == [True] * 6, log
