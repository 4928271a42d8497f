"""Tests that need a real block device (root and losetup, spec/FORMATS-blockdev.md BDEV-11,
BDEV-12, BDEV-20). They run only in the `blockdev_device` nox session
(``python3 run.py blockdev_device``), which sets TIDELOG_DEVICE_TESTS=1; there a missing
losetup or a non-root user is a failure, not a skip. The default suite does not collect them at
all (so it reports no skip): it runs the same code paths on image files, with O_DIRECT and an
image posing as a raw device (tests/unit/test_blockdev_ring.py)."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("TIDELOG_DEVICE_TESTS") == "1" else ["test_*.py"]
