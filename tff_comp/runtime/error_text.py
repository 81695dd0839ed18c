"""What a TensorFlow error says, in one line: its last line and the op it names (the
in-process engines' failures, reported without TensorFlow's stack of graph frames)."""

import re


def last_line(error: Exception) -> str:
  """The last non-blank line of an error's message, at most 300 characters."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  return lines[-1][:300] if lines else ''


# How TensorFlow names the op in vectorization (pfor) and XLA compilation errors.
_OP_PATTERNS = (
  r'No pfor vectorization defined for (\w+)',
  r"of op '(\w+)'",
  r'No converter defined for (\w+)',
  r'unsupported operations?[^:]*:\s*(\w+)',
  r'op: "(\w+)"',
)


def failing_op(error: Exception) -> str:
  """The TensorFlow op an engine failure names ('' if none can be read off)."""
  for pattern in _OP_PATTERNS:
    found = re.search(pattern, str(error), re.IGNORECASE)
    if found:
      return found[1]
  return ''
