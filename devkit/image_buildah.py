"""The same image through buildah (daemonless; Debian's `buildah` package), as a cross-check of the interpreter.

No registry is reachable, so the debootstrapped base (devkit.image_dockerfile.base_image) is imported
into buildah's storage under the FROM name; `buildah bud --pull=never --isolation=chroot` then builds
the unmodified Dockerfile. RUN steps get the build host's CA bundle through an /etc/pip.conf volume
(volumes are not committed). The final image's root is copied out and its config written as
`image.json`, so devkit.image_build checks it exactly like the interpreter's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from devkit import image_root
from devkit.image_dockerfile import base_image, du_bytes, log, parse

TAG = "localhost/kafka-parquet-sink:rehearsal"


def _buildah(out: Path) -> list[str]:
    if shutil.which("buildah") is None:
        raise RuntimeError("buildah is not installed (apt-get install -y buildah)")
    store = out / "buildah"
    return ["buildah", "--root", str(store / "storage"), "--runroot", str(store / "run"),
            "--storage-driver", "overlay"]


def _run(argv: list[str], logfile: Path) -> str:
    with open(logfile, "ab") as log_out:
        log_out.write(f"\n### {' '.join(argv)}\n".encode())
        result = subprocess.run(argv, capture_output=True, text=True)
        log_out.write((result.stdout + result.stderr).encode())
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {result.returncode}: {result.stderr[-1500:]}")
    return result.stdout.strip()


def build(dockerfile: Path, out: Path, build_ca: Path | None) -> None:
    buildah = _buildah(out)
    logfile = out / "build.log"
    images: list[str] = []
    stages: set[str] = set()
    for instruction in parse(dockerfile.read_text()):
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            if words[0] not in stages:
                images.append(words[0])
            if len(words) == 3:
                stages.add(words[2])
    for image in dict.fromkeys(images):
        if image.startswith(("python:", "docker.io/library/python:")):
            name = image if "/" in image else f"docker.io/library/{image}"
            present = subprocess.run([*buildah, "inspect", "--type", "image", name], capture_output=True)
            if present.returncode != 0:
                root, env = base_image(image, out / "cache", logfile)
                container = _run([*buildah, "from", "scratch"], logfile)
                mount = _run([*buildah, "mount", container], logfile)
                subprocess.run(["cp", "-a", f"{root}/.", mount], check=True)
                _run([*buildah, "umount", container], logfile)
                _run([*buildah, "config", *[a for k, v in env.items() for a in ("--env", f"{k}={v}")],
                      "--cmd", "python3", container], logfile)
                _run([*buildah, "commit", "--format", "docker", container, name], logfile)
                _run([*buildah, "rm", container], logfile)
                log(f"buildah: imported the debootstrapped base as {name}")
    volumes = []
    if build_ca:
        pip_conf = out / "buildah" / "pip.conf"
        pip_conf.write_text(f"[global]\ncert = {image_root.BUILD_CA_PATH}\n")
        volumes = ["-v", f"{build_ca}:{image_root.BUILD_CA_PATH}:ro", "-v", f"{pip_conf}:/etc/pip.conf:ro"]
    log("buildah bud --pull=never --isolation=chroot (log in build.log)")
    _run([*buildah, "bud", "--pull=never", "--isolation=chroot", "--format", "docker", *volumes,
          "-f", str(dockerfile), "-t", TAG, str(dockerfile.parent)], logfile)
    inspect = json.loads(_run([*buildah, "inspect", "--type", "image", TAG], logfile))
    config = inspect["Docker"]["config"]
    root = out / "stages" / "buildah-final" / "rootfs"
    image_root.remove_root(out / "stages")
    root.parent.mkdir(parents=True)
    container = _run([*buildah, "from", "--pull=never", TAG], logfile)
    try:
        mount = _run([*buildah, "mount", container], logfile)
        subprocess.run(["cp", "-a", mount, str(root)], check=True)
    finally:
        _run([*buildah, "umount", container], logfile)
        _run([*buildah, "rm", container], logfile)
    health = config.get("Healthcheck")
    image = {"stage": "buildah-final", "builder": "buildah",
             "env": dict(e.split("=", 1) for e in config.get("Env") or []),
             "workdir": config.get("WorkingDir") or "/", "user": config.get("User") or "root",
             "entrypoint": config.get("Entrypoint") or [], "cmd": config.get("Cmd") or [],
             "healthcheck": {"test": health["Test"][1:]} if health and health["Test"][0] == "CMD" else None,
             "expose": list(config.get("ExposedPorts") or {}),
             "stages": {"buildah-final": {"root": str(root), "steps": [
                 {"instruction": h.get("created_by", "")[:160], "layer_bytes": None}
                 for h in inspect.get("History", [])]}}}
    (out / "image.json").write_text(json.dumps(image, indent=2))
    log(f"buildah image {TAG}: root {du_bytes(root) / 1e6:.0f} MB")
