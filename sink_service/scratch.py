"""Each running service owns its scratch area exclusively.

Several services on one host (replicas in a pod, a VM, a test suite) may share one
`SINK_SCRATCH_DIR`, the default above all. Each one works in the first `instance-<n>` directory
under it whose lock it can take (`fcntl.flock`, released by the kernel when the process dies,
`kill -9` included), and clears only that directory: never the checkpoints or state of a live
neighbour.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = ".lock"
MAX_INSTANCES = 64


class ScratchBusy(Exception):
    """Every instance directory is held by a live service."""


@dataclass
class ScratchArea:
    path: Path
    _lock_fd: int

    def release(self) -> None:
        os.close(self._lock_fd)  # closing the descriptor drops the lock


def claim_scratch(base: Path) -> ScratchArea:
    """Lock the first free instance directory under `base` and empty it of what a dead owner left."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(MAX_INSTANCES):
        path = base / f"instance-{n}"
        path.mkdir(exist_ok=True)
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        for entry in path.iterdir():  # a previous owner's leftovers: ours now, and worthless
            if entry.name != LOCK_FILE:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        return ScratchArea(path, fd)
    raise ScratchBusy(
        f"all {MAX_INSTANCES} instance directories under SINK_SCRATCH_DIR={base} are held by running "
        "services; stop one, or give this service its own SINK_SCRATCH_DIR."
    )
