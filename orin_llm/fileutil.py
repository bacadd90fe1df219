"""Files written whole or not at all: the caches (kernel databases, captured steps, repacked planes) are
read by other processes, and a crash or a full disk must never leave half a file under the real name."""
from __future__ import annotations
import os, pathlib, tempfile

class AtomicFile:
  """A new file beside path that replaces it at commit(), whole, or never (abort(), or an exception in a
  `with` block). Readers of path see the old file or the new one; the new one gets `mode` (mkstemp's is 0600)."""
  def __init__(self, path: str | os.PathLike, mode: int = 0o644):
    self.path, self.mode = pathlib.Path(path), mode
    fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".tmp-{self.path.name}-")
    self.file = os.fdopen(fd, "wb")

  def commit(self):
    try:
      self.file.close()
      os.chmod(self.tmp, self.mode)
      os.replace(self.tmp, self.path)
    except BaseException:
      self.abort()
      raise

  def abort(self):
    self.file.close()
    pathlib.Path(self.tmp).unlink(missing_ok=True)

  def __enter__(self): return self.file
  def __exit__(self, typ, value, tb):
    if typ is None: self.commit()
    else: self.abort()

def atomic_write(path: str | os.PathLike, data: bytes | memoryview, mode: int = 0o644):
  """Writes data to path through an AtomicFile."""
  with AtomicFile(path, mode) as f: f.write(data)
