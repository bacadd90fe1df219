"""Host staging with and without huge pages: one load of a model, timed, in a fresh process.
  DEV=CPU python scripts/hostmem_bench.py MODEL {repack|load|cached} [CACHE_DIR]
repack: repack() of every matrix, nothing uploaded; load: load_weights without the planes cache;
cached: load_weights from a planes cache (written first if missing). ORIN_LLM_HUGEPAGES and
vm.nr_hugepages pick the kind; the last line is JSON."""
import json, sys, time
from orin_llm import hostmem
from orin_llm.loader import open_model, load_weights, PlanesCache
from orin_llm.quant import repack
from orin_llm.model import fused_groups

path, what = sys.argv[1], sys.argv[2]
f, cfg = open_model(path)
fuse = fused_groups(cfg, {n: t.qtype for n, t in f.tensors.items()})  # as the engine loads
mats = [n for n in cfg.tensor_shapes() if len(f.tensors[n].shape) > 1]
for n in mats: f.raw(n).sum(dtype="uint64")  # the file's pages in the page cache and mapped, in every variant
t0 = time.perf_counter()
if what == "repack":
  for n in mats: i = f.tensors[n]; repack(f.raw(n), i.qtype, i.shape[0], i.shape[1])
elif what == "load": load_weights(f, cfg, "CPU", fuse=fuse)
else:
  if PlanesCache(sys.argv[3], f, fuse).read() is None: load_weights(f, cfg, "CPU", cache_dir=sys.argv[3], fuse=fuse); t0 = time.perf_counter()
  load_weights(f, cfg, "CPU", cache_dir=sys.argv[3], fuse=fuse)
dt = time.perf_counter() - t0
print(json.dumps({"what": what, "mode": hostmem.mode(), "s": round(dt, 3), "staged": hostmem.summary(),
                  "huge_free_after": hostmem.free_huge_bytes() >> 20}))
