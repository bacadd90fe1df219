"""systemd integration: sd_notify (STATUS=, READY=1, WATCHDOG=1, STOPPING=1) and the journal.

systemd-python (`pip install orin-llm[systemd]`, needs libsystemd) is used when importable; without
it a few lines below speak the notify protocol themselves: one datagram to the AF_UNIX socket named
by NOTIFY_SOCKET ('@' at the start means the abstract namespace). Without NOTIFY_SOCKET (not run
by systemd, or Type= is not notify) every call does nothing."""
from __future__ import annotations
import logging, os, socket, sys

try: from systemd import daemon as _daemon, journal as _journal
except ImportError: _daemon = _journal = None

def _fallback_notify(state: str) -> bool:
  addr = os.environ.get("NOTIFY_SOCKET")
  if not addr: return False
  if addr[0] == "@": addr = "\0" + addr[1:]
  try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
      s.connect(addr); s.sendall(state.encode())
    return True
  except OSError: return False

def notify(state: str) -> bool:
  """Sends state (e.g. 'READY=1', 'STATUS=loading') to the service manager; False if there is none."""
  if not os.environ.get("NOTIFY_SOCKET"): return False
  if _daemon is not None: return bool(_daemon.notify(state))
  return _fallback_notify(state)

def watchdog_interval() -> float | None:
  """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when the watchdog is off or meant for another process."""
  usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
  if not usec or not os.environ.get("NOTIFY_SOCKET"): return None
  if pid and pid != str(os.getpid()): return None
  try: return max(int(usec), 1) / 2e6
  except ValueError: return None

def log_to_journal(logger: logging.Logger) -> bool:
  """Sends logger's records to the journal (with priority and fields) when stderr is the service's
  journal stream (JOURNAL_STREAM names stderr's device:inode) and systemd-python is installed."""
  js = os.environ.get("JOURNAL_STREAM")
  if not js or _journal is None: return False
  try:
    st = os.fstat(sys.stderr.fileno())
    if js != f"{st.st_dev}:{st.st_ino}": return False
  except (OSError, ValueError): return False
  for h in list(logger.handlers):
    if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr: logger.removeHandler(h)
  logger.addHandler(_journal.JournalHandler(SYSLOG_IDENTIFIER="orin-llm"))
  return True
