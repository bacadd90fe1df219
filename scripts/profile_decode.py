#!/usr/bin/env python3
"""Per-kernel breakdown of one decode step: runs the step uncompiled with tinygrad's DEBUG=2 timing
(each kernel synchronized and timed alone) and prints the kernels by time with their bytes and GB/s.
  profile_decode.py MODEL [--context N] [--pos P] [--max-batch B]"""
import argparse
from tinygrad.helpers import Context
from orin_llm.engine import Engine
from kernel_times import kernel_times, print_table

ap = argparse.ArgumentParser(); ap.add_argument("model"); ap.add_argument("--context", type=int, default=704)  # the bench's context: same kernels, so BEAM results are reused
ap.add_argument("--pos", type=int, default=100); ap.add_argument("--top", type=int, default=25)
ap.add_argument("--max-batch", type=int, default=4, help="slots, as the server's and the bench's: the same kernels")
a = ap.parse_args()
eng = Engine(a.model, max_context=a.context, max_batch=a.max_batch)
with Context(BEAM=0): eng.forward(list(range(1, a.pos + 1)), 0)  # fill the cache; these concrete shapes need no search
step = lambda: eng.profile_step().realize()  # the same kernels as the compiled step
step()  # compile everything once
print_table(kernel_times(step), "one decode step", a.top)
