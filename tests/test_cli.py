"""`orin-llm generate` on a terminal: stdout and stderr share the screen, and no log line lands inside the answer."""
import os, pathlib, pty, subprocess, sys
from gguf import GGMLQuantizationType as QT
from orin_llm.synth import write_model, preset
from conftest import LLAMA_VOCAB

ROOT = pathlib.Path(__file__).resolve().parents[1]

def on_terminal(args, env) -> str:
  """Runs the command with stdout and stderr on one pseudo-terminal; returns what the screen got."""
  main, sub = pty.openpty()
  proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sub, stderr=sub, env=env)
  os.close(sub)
  out = b""
  while True:
    try: chunk = os.read(main, 4096)
    except OSError: break  # EIO: the other side is closed
    if not chunk: break
    out += chunk
  os.close(main)
  assert proc.wait(300) == 0, out.decode(errors="replace")[-3000:]
  return out.decode().replace("\r\n", "\n")

def test_log_lines_never_split_the_answer(tmp_path):
  model = write_model(tmp_path / "m.gguf", preset("tiny-llama", n_layers=1), QT.Q4_0, LLAMA_VOCAB, vocab_size=512)
  env = {**os.environ, "DEV": "CPU", "PYTHONPATH": str(ROOT)}
  cmd = [sys.executable, "-m", "orin_llm", "generate", "--model", str(model), "-p", "Once upon a time", "-n", "24"]
  # the answer alone (stdout to a pipe: nothing held, nothing run beforehand); greedy, so the terminal gets the same
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
  assert r.returncode == 0 and "orin-llm: compiling the" in r.stderr, r.stderr
  answer = r.stdout.rstrip("\n")
  assert answer.strip()
  screen = on_terminal(cmd, env)  # the engine's steps are compiled anew (the kernels come from tinygrad's cache)
  assert "orin-llm: compiling the" in screen and answer in screen, (answer, screen)
  before = screen[:screen.index(answer)]
  assert before == "" or before.endswith("\n"), screen  # the answer starts on a line of its own
  assert screen[screen.index(answer) + len(answer)] == "\n"  # and ends its line before anything else is written
