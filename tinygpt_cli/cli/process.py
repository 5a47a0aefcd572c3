"""What the console script sets for its whole process, once, and nothing else does: the
model's passes and the analyses change nothing in a process that imports tinygpt_cli (a
notebook's, a program's, the MCP server's calls), and only a command line run by `tinygpt`
(entry.main, which marks its run context `own_process`) tunes its own memory, at the moment
its command needs it:

- glibc's malloc keeps up to 1 GB of freed memory for reuse instead of handing it back to the
  system at once (`keep_freed_memory`, when the command loads or trains a model): a traced
  pass keeps every value, and fresh pages from the kernel must be zeroed
  (benchmarks/results.md, "Why the code is as it is"). The peak memory is unchanged; it is
  only reused. A no-op elsewhere than glibc.
- NumPy's request for 2 MB pages (madvise, for arrays of 4 MB and more) is turned off for the
  attribution graph (`small_pages`): its adjacency is mostly zeros never written, and with
  2 MB pages a write maps the 2 MB around it, with 4 kB pages only the 4 kB (the figures:
  benchmarks/results.md, "Why the code is as it is").
"""

from __future__ import annotations

import functools

from .context import RunContext


def keep_freed_memory(context: RunContext) -> None:
    """glibc's malloc told to keep freed memory, once, in the console script's own process."""
    if context.own_process:
        keep_freed_memory_now()


@functools.cache
def keep_freed_memory_now() -> bool:
    """glibc's malloc told to keep freed memory in this process, whatever runs it (the
    benchmarks that time passes in their own process do as the console script does)."""
    try:
        import ctypes  # NumPy has loaded it already: only model-running commands come here

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20) and mallopt(m_trim_threshold, 1 << 30))


def small_pages(context: RunContext) -> None:
    """NumPy's 2 MB pages off for the rest of the console script's own process."""
    if not context.own_process:
        return
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    setter = getattr(core.multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)
