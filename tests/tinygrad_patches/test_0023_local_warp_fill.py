"""0023-local-warp-fill: LOCAL_WARP_FILL=1 (the default since measured on an H200: a 1B Q6_K's pp512 with no search
went from 17.8k to 23.3k tok/s, decode unchanged; seventeenth session, docs/PERF.md; 0 turns it off): where the heuristic's first three
local picks make a block of fewer than 32 threads, less than a warp, the three whose sizes multiply to the most are
taken instead. A prefill chunk's dequantization of a Q6_K weight (E_524288_4_2_8 on the 1B's gate+up: a quant block's
4 x 2 x 2 elements sharing a scale, ranked first as expand axes) got 16-thread blocks: 396 us with the hand-coded
opts, 51 us after BEAM added LOCAL 16 on the block axis (fourteenth session's ledger, H100). 0001-0022 give 16
threads whatever the knob. No GPU needed for the opts (a renderer constructed without a device); the numerics run on
tinygrad's CUDA-flavoured emulator against gguf's own dequantization in float64, on fresh random blocks."""
import json, os, subprocess, sys, textwrap
import pytest
import matvec_kernels

OPTS = textwrap.dedent('''
  import json, sys
  import numpy as np
  from gguf import GGMLQuantizationType as QT
  from tinygrad import Tensor, dtypes
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.helpers import Target, prod
  from tinygrad.renderer.cstyle import CUDARenderer
  from tinygrad.uop.ops import Ops
  from orin_llm.quant import QuantWeight, empty_planes
  O, K, R, qt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), QT[sys.argv[4]]
  planes = empty_planes(qt, O, K, "CPU")
  y = QuantWeight(qt, O, K, planes)(Tensor.empty(R, K, device="CPU", dtype=dtypes.float16))
  ren = CUDARenderer(Target("CUDA", "", "sm_87"), use_nvcc=True)
  for call in y.linear_with_vars()[0].src:
    if call.src[0].op is not Ops.SINK: continue
    sink = full_rewrite_to_sink(call.src[0], ren)
    locs = [o for o in sink.arg.applied_opts if o.op.name == "LOCAL"]
    print(json.dumps({"elementwise": not any(u.op is Ops.REDUCE for u in call.src[0].toposort()),
                      "opts": [[o.op.name, o.axis, o.arg] for o in sink.arg.applied_opts],
                      "threads": prod(o.arg for o in locs), "local_axes": sorted({o.axis for o in locs})}))
''')

def dequant_kernel(O: int, K: int, qtype: str, fill: str | None) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "LOCAL_WARP_FILL"} | ({"LOCAL_WARP_FILL": fill} if fill else {}) | {"DEV": "CPU"}
  r = subprocess.run([sys.executable, "-c", OPTS, str(O), str(K), "512", qtype], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  [k] = [k for k in map(json.loads, (l for l in r.stdout.splitlines() if l.startswith("{"))) if k["elementwise"]]
  return k

def test_q6_k_dequantization_gets_a_warp_at_least():
  off = dequant_kernel(16384, 2048, "Q6_K", "0")
  assert off["threads"] == 16, off  # the problem: a half-warp block
  on = dequant_kernel(16384, 2048, "Q6_K", None)  # the default
  assert 32 <= on["threads"] <= 128 and 0 in on["local_axes"], on  # the block axis now local too
  assert dequant_kernel(16384, 2048, "Q6_K", "1") == on

def test_blocks_of_a_warp_or_more_are_left_alone():
  # Q4_K's dequantization already gets LOCAL 32 on its first axis: the same opts either way
  assert dequant_kernel(4096, 4096, "Q4_K", "1")["opts"] == dequant_kernel(4096, 4096, "Q4_K", "0")["opts"]

def test_filled_dequantization_computes_the_product():
  # 32 input rows: the chunk path (the weight dequantized to float16 first, then the product)
  err, _ = matvec_kernels.product_error("Q6_K", 1024, 32, {**os.environ, "LOCAL_WARP_FILL": "1"})
  assert err < 2e-3  # float16 weights and products
