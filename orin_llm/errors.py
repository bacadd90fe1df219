class OrinError(Exception):
  """A problem the user can act on (bad file, bad argument, unsupported model). The CLI prints
  it as one line and exits non-zero, without a traceback."""
