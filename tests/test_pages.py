"""storage/pages.py: large arrays on private small pages, made at once when asked. Read from
the kernel's own account of this process's mappings (/proc/self/smaps), Linux only."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from tinygpt_cli.storage.pages import fresh_pages, make_now, weight_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux")
                                or not hasattr(mmap, "MADV_NOHUGEPAGE"),
                                reason="the page advice is Linux's")

MB = 1 << 20


def mapping_of(a: np.ndarray) -> dict[str, str]:
    """The /proc/self/smaps entry of the mapping that holds a's first byte: its permissions
    ('perms', e.g. rw-p) and its fields (Rss, AnonHugePages, ...)."""
    where = a.ctypes.data
    entry: dict[str, str] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                if entry is not None:
                    return entry
                if lo <= where < hi:
                    entry = {"perms": head[1]}
            elif entry is not None and head[0].endswith(":"):
                entry[head[0][:-1]] = head[1]
    assert entry is not None, "no mapping holds the array"
    return entry


def rss_kb(a: np.ndarray) -> int:
    return int(mapping_of(a)["Rss"])


@pytest.mark.parametrize("whole", [False, True])
def test_fresh_pages_are_private_zeros_of_the_shape(whole):
    a = fresh_pages((3, 5 * MB // 12), np.float32, whole=whole)
    assert a.shape == (3, 5 * MB // 12) and a.dtype == np.float32
    assert not a.any()
    a[:] = 2.0
    assert float(a.sum()) == 2.0 * a.size
    # shared anonymous memory is the kernel's shmem, whose faults cost twice a private one's
    assert mapping_of(a)["perms"].endswith("p")


def test_whole_pages_are_made_at_once_and_lazy_ones_are_not():
    lazy = fresh_pages((16 * MB,), np.uint8)
    made = fresh_pages((16 * MB,), np.uint8, whole=True)
    assert rss_kb(lazy) < 1024  # nothing written: nothing made
    assert rss_kb(made) >= 16 * 1024
    assert mapping_of(lazy).get("AnonHugePages", "0") == "0"


def test_make_now_makes_the_pieces_pages_and_no_others():
    a = fresh_pages((64 * MB,), np.uint8)
    before = rss_kb(a)
    make_now(a[8 * MB: 24 * MB])
    grown = rss_kb(a) - before
    assert 16 * 1024 <= grown <= 16 * 1024 + 8  # the piece's 16 MB (and an edge page)
    assert not a.any()  # made, still zeros


def test_make_now_leaves_other_arrays_alone():
    plain = np.zeros(8 * MB, np.uint8)
    make_now(plain)  # not over a mapping of ours: nothing, no error
    strided = fresh_pages((8 * MB // 64, 64), np.uint8)
    before = rss_kb(strided)
    make_now(strided[:, :8])  # not contiguous: left to the faults
    assert rss_kb(strided) == before


def test_a_large_weight_is_made_as_written_a_small_one_at_once():
    from tinygpt_cli.storage.pages import WHOLE_AT_ONCE

    small = weight_pages((WHOLE_AT_ONCE // 8,), np.float32)  # half the bound
    assert rss_kb(small) >= WHOLE_AT_ONCE // 2 // 1024
    large = weight_pages((WHOLE_AT_ONCE // 4 + 1024,), np.float32)  # just over it
    assert rss_kb(large) < 1024
