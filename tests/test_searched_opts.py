"""scripts/searched_opts.py: a BEAM ledger's searched layouts as scripts/step_opts.py's overrides (kind, shape with `?` for a
symbolic size, opts a tensor core's included), and step_opts reading them back (--kernels FILE, TC:0:-1/0/1)."""
import io, json, lzma, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import searched_opts, step_opts  # noqa: E402

def opt(op, axis, arg): return f"Opt(op=OptOps.{op}, axis={axis}, arg={arg})"

def row(name, h, f, opts, uses=16, **kw):
  return {"name": name, "heuristic_us": h, "final_us": f, "uses": uses, "opts": opts, "skipped_small": False,
          "kept_heuristic": False, **kw}

def test_shape_key_of_names():
  assert searched_opts.shape_key("r_2048") == "r:2048"
  assert searched_opts.shape_key("E_((start_pos+255)//256+2)_16384_256") == "E:?,16384,256"
  assert searched_opts.shape_key("r_4_8_2048_72_((start_pos+255)//256*64+128)") == "r:4,8,2048,72,?"
  assert searched_opts.shape_key("r_blocks_2_8_4_1024_32_2") == "r:?,2,8,4,1024,32,2"
  assert searched_opts.shape_key("r_4_4_8_128_72_(group_blocks*64)") == "r:4,4,8,128,72,?"
  # a variable's bare name is one size, `_` and all (the engine's group_blocks, start_pos, chunk_len, hist_row)
  assert searched_opts.shape_key("E_group_blocks_4096_256") == "E:?,4096,256"
  assert searched_opts.shape_key("r_4096_group_blocks_256") == "r:4096,?,256"
  assert searched_opts.shape_key("r_hist_row_32_pos0") == "r:?,32,?"
  for bad in ("copy_2048", "x_2048", "r2048", "E", "r__2048"):
    try: searched_opts.shape_key(bad); raise AssertionError(bad)
    except ValueError: pass

def test_overrides_from_a_ledger(rng):
  big = float(rng.uniform(0.2, 0.5))  # a searched gain this share of the hand-coded time
  h = float(rng.uniform(20, 200))
  tc = [opt("TC", 0, "(-1, 0, 1)"), opt("UPCAST", 2, 4), opt("SWAP", 0, 2)]
  rows = [row("r_2048", 17.6, 11.6, [opt("GROUPTOP", 0, 16), opt("GROUP", 0, 4)], uses=33),
          row("r_4_8_2048_72_((start_pos+255)//256*64+128)", h, h * (1 - big), tc),
          row("E_4194304", h, h * 0.99, [opt("UPCAST", 0, 4)]),                        # under the gain asked
          row("r_512_2048_2048", h, h * 0.5, [opt("UPCAST", 0, 4)], kept_heuristic=True),  # the search kept the heuristic's
          row("E_8192", h, h * 0.5, [opt("UPCAST", 0, 4)], skipped_small=True),          # not searched
          row("r_512_2048", 20.0, 15.0, [opt("GROUP", 0, 16)], uses=32),
          row("r_512_2048", 20.0, 12.0, [opt("GROUP", 0, 32)], uses=1),                  # the same key: less time a step
          row("r_512_2048", 20.0, 19.0, [opt("GROUP", 0, 16)], uses=1),                  # the first layout again, less gain
          row("r_64_2048", h, None, [opt("GROUP", 0, 16)])]                              # no time: left out
  out, notes = searched_opts.overrides(rows, min_gain=0.05)
  assert out == {"r:2048": "GROUPTOP:0:16,GROUP:0:4", "r:4,8,2048,72,?": "TC:0:-1/0/1,UPCAST:2:4,SWAP:0:2",
                 "r:512,2048": "GROUP:0:16"}
  assert len(notes) == 1 and "r:512,2048: 2 searched layouts" in notes[0]
  assert searched_opts.overrides(rows, min_gain=0.0)[0].keys() == out.keys() | {"E:4194304"}
  assert list(searched_opts.overrides(rows, match="^r_2048$")[0]) == ["r:2048"]
  # each opts list reads back as step_opts takes it, the tensor core's argument a tuple
  for k, v in out.items():
    back = step_opts.parse_opts(v)
    assert ",".join(step_opts.opt_text(o) for o in back) == v
  assert step_opts.parse_opts("TC:0:-1/0/1")[0].arg == (-1, 0, 1)

def test_the_scripts_together(tmp_path):
  ledger = tmp_path / "ledger.jsonl"
  ledger.write_text("\n".join(json.dumps(r) for r in [
    row("r_2048", 17.6, 11.6, [opt("GROUPTOP", 0, 16), opt("GROUP", 0, 4)], uses=33),
    row("r_?_bad", 10, 5, ["Opt(op=OptOps.UPCAST, axis=0, arg=x)"])]) + "\n")
  r = subprocess.run([sys.executable, ROOT / "scripts/searched_opts.py", ledger, "--list"], capture_output=True, text=True,
                     timeout=60)
  assert r.returncode == 0, r.stderr
  assert r.stdout == "r:2048=GROUPTOP:0:16,GROUP:0:4\n" and "r_?_bad: left out" in r.stderr
  xz = tmp_path / "ledger.jsonl.xz"
  xz.write_bytes(lzma.compress(ledger.read_bytes()))
  rx = subprocess.run([sys.executable, ROOT / "scripts/searched_opts.py", xz], capture_output=True, text=True, timeout=60)
  assert rx.returncode == 0 and rx.stdout == r.stdout
  kernels = tmp_path / "k.txt"
  kernels.write_text("# from a ledger\n" + r.stdout + "r:16,2=UPCST:0:2\n")
  env = {k: v for k, v in os.environ.items() if k != "BEAM"}
  r = subprocess.run([sys.executable, ROOT / "scripts/step_opts.py", "--kernels", kernels, "--", "bench", "--beam", "0"],
                     capture_output=True, text=True, timeout=60, env=env)
  assert r.returncode != 0 and "'UPCST:0:2' is not an opt" in r.stderr  # every line of the file read and checked
  r = subprocess.run([sys.executable, ROOT / "scripts/step_opts.py", "--kernels", tmp_path / "none.txt", "--", "bench"],
                     capture_output=True, text=True, timeout=60, env=env)
  assert r.returncode != 0 and "--kernels" in r.stderr

def test_keys_no_kernel_took_are_named():
  out = io.StringIO()
  step_opts._matched.clear(); step_opts._matched.add("r:2048")
  step_opts._name_unmatched(["r:2048", "E:?,4096,256"], out)
  assert "no kernel took E:?,4096,256" in out.getvalue() and "r:2048," not in out.getvalue()
  out = io.StringIO(); step_opts._name_unmatched(["r:2048"], out)
  assert out.getvalue() == ""
