"""Each running service owns its scratch area exclusively, and nobody else can steer or read it.

Several services on one host (replicas in a pod, a VM, a test suite) may share one
`SINK_SCRATCH_DIR`, the default above all. Each one works in the first `instance-<n>` directory
under it whose lock it can take (`fcntl.flock`, released by the kernel when the process dies,
`kill -9` included), and clears only that directory: never the checkpoints or state of a live
neighbour.

The default lies under the system temp directory, where any local user can create names first.
So the base and the instance directories must be real directories (not symlinks) owned by the
service's user, or the service refuses to start: otherwise the start-up cleanup would delete
whatever a planted link points at. The service creates them 0700 (and makes its instance
directory 0700 whatever it was), so files in flight are not readable by other users.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = ".lock"
MAX_INSTANCES = 64


class ScratchError(Exception):
    """The scratch area cannot be used; the message names `SINK_SCRATCH_DIR`."""


class ScratchBusy(ScratchError):
    """Every instance directory is held by a live service."""


class ScratchUnsafe(ScratchError):
    """A directory of the scratch area is a symlink or belongs to another user."""


@dataclass
class ScratchArea:
    path: Path
    _lock_fd: int

    def release(self) -> None:
        os.close(self._lock_fd)  # closing the descriptor drops the lock


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_private_dir(name: str | Path, dir_fd: int | None, shown: Path) -> int:
    """Open (creating it 0700 if missing) a directory that must not be a symlink and must belong to
    this process's user; make it 0700. `O_NOFOLLOW` and `fstat` on the open descriptor leave no
    moment in which a link swapped in could be followed."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symlink" if os.path.islink(shown) else "not a directory"
            raise ScratchUnsafe(
                f"SINK_SCRATCH_DIR: {shown} is {kind}; the service works only in real directories "
                "that its own user owns (a link there could make its start-up cleanup delete another "
                "directory's files). Remove it, or set SINK_SCRATCH_DIR to a directory of your own (the real "
                "path, if you linked it on purpose)."
            ) from None
        raise
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        os.close(fd)
        raise ScratchUnsafe(
            f"SINK_SCRATCH_DIR: {shown} is owned by uid {info.st_uid}, not by this service's user "
            f"(uid {os.geteuid()}); another user could read its files or plant links in it. Remove "
            "it, or set SINK_SCRATCH_DIR to a path the service creates itself (a new directory "
            "below a mount point, e.g. /scratch/sink)."
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd


def _clear(instance_fd: int) -> None:
    """Delete a previous owner's leftovers, never following a link out of the directory."""
    with os.scandir(instance_fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name != LOCK_FILE]
    for name, is_dir in names:
        if is_dir:
            shutil.rmtree(name, dir_fd=instance_fd)  # resists symlink attacks on Linux (openat-based)
        else:
            os.unlink(name, dir_fd=instance_fd)


def claim_scratch(base: Path) -> ScratchArea:
    """Lock the first free instance directory under `base` and empty it of what a dead owner left.

    Raises `ScratchError` (naming `SINK_SCRATCH_DIR`) for a busy, unsafe or unusable area."""
    try:
        return _claim(base)
    except ScratchError:
        raise
    except OSError as exc:
        raise ScratchError(f"SINK_SCRATCH_DIR={base} cannot be used: {exc}") from exc


def _claim(base: Path) -> ScratchArea:
    base = Path(os.path.abspath(base))
    base.parent.mkdir(parents=True, exist_ok=True)
    base_fd = _open_private_dir(base, None, base)
    try:
        for n in range(MAX_INSTANCES):
            name = f"instance-{n}"
            instance_fd = _open_private_dir(name, base_fd, base / name)
            try:
                fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=instance_fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                _clear(instance_fd)  # a previous owner's leftovers: ours now, and worthless
                return ScratchArea(base / name, fd)
            finally:
                os.close(instance_fd)
    finally:
        os.close(base_fd)
    raise ScratchBusy(
        f"all {MAX_INSTANCES} instance directories under SINK_SCRATCH_DIR={base} are held by running "
        "services; stop one, or give this service its own SINK_SCRATCH_DIR."
    )
