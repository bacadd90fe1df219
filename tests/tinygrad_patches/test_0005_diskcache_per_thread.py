"""0005-diskcache-per-thread: tinygrad's kernel cache (sqlite) opens one connection per thread. Stock
tinygrad shares one connection, which sqlite3 refuses to use from any thread but its creator, so a
server that warms up in one thread and compiles in its engine thread fails with ProgrammingError."""
import os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent("""
  import threading, secrets
  from tinygrad.helpers import diskcache_get, diskcache_put
  key = secrets.token_hex(8)
  diskcache_put("orin_test", key, [1, 2, 3])             # opens the cache in the main thread
  out = {}
  def other():
    try:
      out["got"] = diskcache_get("orin_test", key)     # the same entry, read from another thread
      diskcache_put("orin_test", key + "x", "from a thread")
    except Exception as e: out["error"] = repr(e)
  t = threading.Thread(target=other); t.start(); t.join()
  assert "error" not in out, out["error"]
  assert out["got"] == [1, 2, 3], out
  assert diskcache_get("orin_test", key + "x") == "from a thread"
  print("ok")
""")

def test_cache_usable_from_another_thread(tmp_path):
  env = {**os.environ, "CACHEDB": str(tmp_path / "cache.db")}
  r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
