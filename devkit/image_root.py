"""Run commands inside an image root filesystem without Docker: a private mount namespace and chroot.

Why not a plain `chroot`: the JVM, apt and Spark need /proc and /dev, and Docker gives every RUN
step /etc/resolv.conf and /etc/hosts. Each command here runs as `unshare --mount` + mounts + `chroot`,
so the mounts live only as long as the command: nothing can leak onto the host, and deleting a root
never walks into a bind-mounted /dev. The process keeps one PID from `unshare` to the program
(every step `exec`s), and runs in its own session, so it is stopped by PID and process group.

`build_ca`: the build host's CA bundle, offered read-only to a RUN step at BUILD_CA_PATH (this machine's
egress re-signs TLS, so pip needs it; `docker build --secret` is the Docker way). It is never copied
into the root: the empty mount point is removed when the step ends.

`container`: a directory for a container's writable layer (overlayfs `upper`, `work`, merged `rootfs`):
the command sees the image's files but writes only there, so the image root stays as built.

`kubernetes=True` mimics deploy/kubernetes/deployment.yaml: the root read-only
(readOnlyRootFilesystem) and an empty, world-writable /tmp (the emptyDir).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# sh run by `unshare`: mount, then exec chroot -> env -> the command (one PID throughout).
_MOUNT_AND_EXEC = r"""
set -e
r="$IMG_ROOT"
if [ -n "$IMG_CONTAINER" ]; then  # a container's own writable layer over the image, as Docker gives it
  c="$IMG_CONTAINER"
  mount -t overlay overlay -o "lowerdir=$r,upperdir=$c/upper,workdir=$c/work" "$c/rootfs"
  r="$c/rootfs"
fi
if [ "$IMG_READONLY" = 1 ]; then mount --bind "$r" "$r"; fi
mount -t proc proc "$r/proc"
mount --rbind /dev "$r/dev"
mount -t sysfs sysfs "$r/sys" 2>/dev/null || true
for f in /etc/resolv.conf /etc/hosts; do
  if [ -f "$f" ] && [ -e "$r$f" ]; then mount --bind "$f" "$r$f"; fi
done
if [ -n "$IMG_BUILD_CA" ]; then
  mount --bind "$IMG_BUILD_CA" "$r$BUILD_CA_PATH"; mount -o remount,bind,ro "$r$BUILD_CA_PATH"
fi
if [ "$IMG_EMPTY_TMP" = 1 ]; then mount -t tmpfs -o mode=1777,size=4g tmpfs "$r/tmp"; fi
if [ "$IMG_READONLY" = 1 ]; then mount -o remount,bind,ro "$r"; fi
exec chroot --userspec="$IMG_USER" "$r" /usr/bin/env -i -C "$IMG_WORKDIR" "$@"
"""


BUILD_CA_PATH = "/run/build-host-ca.crt"


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` in this (the host's) mount namespace: there must be none."""
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def remove_root(root: Path) -> None:
    """Delete a root filesystem; refuse if anything is mounted inside it (a bind-mounted /dev would go)."""
    if not root.exists():
        return
    if mounts_under(root):
        raise RuntimeError(f"refusing to delete {root}: mounted inside: {mounts_under(root)}")
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=True)


def resolve_user(root: Path, user: str) -> str:
    """USER value -> 'uid:gid' for chroot --userspec, looked up in the image's /etc/passwd and /etc/group."""
    name, _, group = user.partition(":")

    def lookup(file: str, key: str, field: int) -> str:
        if key.isdigit():
            return key
        for line in (root / "etc" / file).read_text().splitlines():
            parts = line.split(":")
            if parts[0] == key:
                return parts[field]
        raise RuntimeError(f"USER {user!r}: {key!r} is not in the image's /etc/{file}")

    uid = lookup("passwd", name or "root", 2)
    if group:
        gid = lookup("group", group, 2)
    elif name.isdigit():
        gid = "0" if uid == "0" else uid
        for line in (root / "etc" / "passwd").read_text().splitlines():
            parts = line.split(":")
            if parts[2] == uid:
                gid = parts[3]
    else:
        gid = lookup("passwd", name, 3)
    return f"{uid}:{gid}"


def command(root: Path, argv: list[str], env: dict[str, str], *, user: str = "0:0", workdir: str = "/",
            kubernetes: bool = False, build_ca: Path | None = None,
            container: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The host argv and environment that run `argv` inside `root` (see the module docstring)."""
    if build_ca is not None:
        (root / BUILD_CA_PATH.lstrip("/")).touch()
    for name in ("etc/resolv.conf", "etc/hosts"):  # Docker bind-mounts its own over these
        target = root / name
        if not target.exists() and not target.is_symlink():
            target.touch()
    if container is not None:
        for name in ("upper", "work", "rootfs"):
            (container / name).mkdir(parents=True, exist_ok=True)
    host_env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "IMG_CONTAINER": str(container.resolve()) if container else "",
        "IMG_ROOT": str(root.resolve()),
        "IMG_USER": resolve_user(root, user),
        "IMG_WORKDIR": workdir,
        "IMG_READONLY": "1" if kubernetes else "0",
        "IMG_EMPTY_TMP": "1" if kubernetes else "0",
        "IMG_BUILD_CA": str(build_ca or ""),
        "BUILD_CA_PATH": BUILD_CA_PATH,
    }
    assignments = [f"{k}={v}" for k, v in env.items()]
    return (["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _MOUNT_AND_EXEC, "sh",
             *assignments, *argv], host_env)


def run(root: Path, argv: list[str], env: dict[str, str], *, user: str = "0:0", workdir: str = "/",
        kubernetes: bool = False, log: Path | None = None, check: bool = True, build_ca: Path | None = None) -> int:
    """Run `argv` in `root` to completion (a RUN step, a one-off check)."""
    host_argv, host_env = command(root, argv, env, user=user, workdir=workdir, kubernetes=kubernetes,
                                  build_ca=build_ca)
    try:
        with open(log, "ab") if log else open(os.devnull, "wb") as out:
            result = subprocess.run(host_argv, env=host_env, stdout=out if log else None,
                                    stderr=subprocess.STDOUT if log else None, start_new_session=True)
    finally:
        if build_ca is not None:
            (root / BUILD_CA_PATH.lstrip("/")).unlink(missing_ok=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{argv!r} in {root} exited {result.returncode}")
    return result.returncode


def start(root: Path, argv: list[str], env: dict[str, str], *, user: str, workdir: str, log: Path,
          kubernetes: bool = False, container: Path | None = None) -> subprocess.Popen:
    """Start `argv` in `root` in the background (the container's main process); stop it by its process group.

    With `container`, exec_in() must be given `container / "rootfs"` as its root."""
    host_argv, host_env = command(root, argv, env, user=user, workdir=workdir, kubernetes=kubernetes,
                                  container=container)
    with open(log, "ab") as out:
        return subprocess.Popen(host_argv, env=host_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def exec_in(pid: int, root: Path, argv: list[str], env: dict[str, str], *, user: str, workdir: str = "/",
            timeout_s: float = 30) -> subprocess.CompletedProcess:
    """`docker exec`: run `argv` in the mount namespace of a running container process, as `user`."""
    assignments = [f"{k}={v}" for k, v in env.items()]
    host_argv = ["nsenter", "--target", str(pid), "--mount", "--", "chroot",
                 f"--userspec={resolve_user(root, user)}", str(root.resolve()), "/usr/bin/env", "-i", "-C", workdir,
                 *assignments, *argv]
    return subprocess.run(host_argv, capture_output=True, text=True, timeout=timeout_s)
