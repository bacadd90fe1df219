#!/usr/bin/env python3
"""The kernels of one engine step as tinygrad would compile them for an NVIDIA GPU, on a machine without one: each
kernel of the step is scheduled (not run), optimized by the hand-coded opts (tinygrad's heuristic and patch 0003)
for a CUDA renderer constructed without a device, and printed with its buffers' sizes and opts; --show prints the
CUDA source of the kernels whose name contains a string. What the tenth and eleventh sessions found without a GPU
came from reading such source (docs/PERF.md): loads that are not vectors, warps that read rows apart, divisions by
runtime values, axes that keep tensor cores away.
  DEV=CPU python3 render_kernels.py MODEL [--step decode|verify|chunk|batch] [--rows N] [--pos P] [--context N]
                                          [--arch sm_87] [--show SUBSTR]
--step chunk runs the matrix form a GPU runs (float16 products on tensor cores), --rows rows (default 512);
--step verify --rows K (default 8); --step batch --rows B (default 4) sequences at P, P+7, ...
A small model keeps it quick: `orin-llm synth --preset llama-3.2-1b` writes every layer, but one is enough to read
(scripts/make_models.sh names the presets; write_model(..., preset(NAME, n_layers=1), ...) in Python)."""
import argparse, re
from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render, ProgramInfo
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import CUDARenderer
from tinygrad.uop.ops import Ops, PatternMatcher, UPat, UOp, graph_rewrite

_PM = PatternMatcher([(UPat(Ops.PROGRAM, src=(UPat(Ops.SINK, name="sink"),), name="prg"), do_linearize),
                      (UPat(Ops.PROGRAM, src=(UPat(), UPat(Ops.LINEAR, name="lin")), name="prg"), do_render)])

def render(ast, ren) -> tuple[str, tuple, str]:
  """(name, applied opts, CUDA source) of a kernel's AST optimized by the hand-coded opts for the renderer."""
  sink = full_rewrite_to_sink(ast, ren)
  src = graph_rewrite(UOp(Ops.PROGRAM, src=(sink,), arg=ProgramInfo.from_sink(sink, ren.target)), _PM, ctx=ren).src[-1].arg
  return re.sub(r"\x1b\[[0-9;]*m", "", sink.arg.name), sink.arg.applied_opts, src

def step_kernels(eng, step: str, rows: int, pos: int) -> list:
  """The kernel calls (ASTs with their buffers) of one step's model, its variables bound as the engine binds them."""
  from orin_llm.model import Rows
  st, p = eng.state, eng.v_pos.bind(pos)
  if step == "decode": out = eng.model(st.next_tok[0:1], Rows((p,), 1, eng.v_slot.bind(0)))
  elif step == "verify": out = eng.model(st.prompt[p:p + rows], Rows((p,), rows, eng.v_slot.bind(0)), all_rows=True)
  elif step == "chunk": out = eng.model(st.prompt[p:p + rows], Rows((p,), rows, eng.v_slot.bind(0)), eng.v_len.bind(rows))
  else:
    starts = tuple(v.bind(pos + 7 * b) for b, v in enumerate(eng.v_rows[:rows]))
    out = eng.model(st.next_tok[0:rows], Rows(starts, 1, 0, eng.v_blocks.bind((pos + 7 * rows) // 256 + 1)))
  return [c for c in out.linear_with_vars()[0].src if c.op is Ops.CALL and c.src[0].op is Ops.SINK]

def step_engine(model, step: str, rows: int | None, context: int):
  """(an engine on the CPU built for the step, the step's rows: --rows or its default) as a GPU would run it."""
  from orin_llm import quant
  from orin_llm.engine import Engine
  rows = rows or {"decode": 1, "verify": 8, "chunk": 512, "batch": 4}[step]
  if step == "chunk": quant.MATMUL_ROWS = 32  # the GPU's matrix form, which the CPU backend (no tensor cores) does not take
  return Engine(model, max_context=context, device="CPU", chunk=rows if step == "chunk" else None,
                max_batch=rows if step == "batch" else 1), rows

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("model"); ap.add_argument("--step", choices=("decode", "verify", "chunk", "batch"), default="decode")
  ap.add_argument("--rows", type=int, default=None); ap.add_argument("--pos", type=int, default=1000)
  ap.add_argument("--context", type=int, default=4352); ap.add_argument("--arch", default="sm_87", help="sm_87: the Orin; sm_90: an H100")
  ap.add_argument("--show", default=None, help="print the CUDA source of the kernels whose name contains this")
  a = ap.parse_args()
  eng, rows = step_engine(a.model, a.step, a.rows, a.context)
  ren = CUDARenderer(Target("CUDA", "", a.arch), use_nvcc=True)  # nvcc: constructs with no CUDA library
  for call in step_kernels(eng, a.step, rows, a.pos):
    name, opts, src = render(call.src[0], ren)
    print(f"{name:48s} {[b.shape[0] for b in call.src[1:]]} {[f'{o.op.name}({o.axis},{o.arg})' for o in opts]}")
    if a.show and a.show in name: print(src)

if __name__ == "__main__": main()
