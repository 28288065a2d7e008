"""A small Dockerfile interpreter: builds the repository's Dockerfile into root filesystems, without Docker.

It reads the Dockerfile itself (FROM ... AS, multi-stage, RUN, COPY [--from|--chown|--chmod], ENV, ARG,
WORKDIR, USER, EXPOSE, LABEL, HEALTHCHECK, ENTRYPOINT, CMD) and honours .dockerignore, so a wrong path,
a missing package or a bad user in the file fails here as it would in `docker build`. Instructions it
does not know fail loudly rather than being skipped. RUN steps run in the stage's root through
devkit.image_root (chroot in a private mount namespace, with the stage's ENV, WORKDIR and USER).

Base images cannot be pulled here (no registry is reachable), so `python:<3.11.x>-slim-bookworm` is
rebuilt the way it is made: Debian bookworm `minbase` by debootstrap, the slim images' dpkg excludes,
ca-certificates/netbase/tzdata, and Python 3.11 - Debian's python3.11 package (3.11.2), linked at
/usr/local/bin/python like the official image's own build of 3.11.x.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from devkit import image_root

DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# debian:*-slim (debuerreotype --slimify): what the official slim images leave out of every package.
SLIM_DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
"""
SOURCES = """\
Types: deb
URIs: http://deb.debian.org/debian
Suites: {suite} {suite}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: {suite}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


# What RUN steps get, pointing at the build host's CA bundle, when one is given.
BUILD_CA_VARS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def log(message: str) -> None:
    print(f"[image] {time.strftime('%H:%M:%S')} {message}", flush=True)


# --- parsing -------------------------------------------------------------------------------------

@dataclass
class Instruction:
    line: int
    keyword: str
    args: str

    def __str__(self) -> str:
        text = " ".join(self.args.split())
        return f"line {self.line}: {self.keyword} {text[:110]}{'...' if len(text) > 110 else ''}"


def parse(text: str) -> list[Instruction]:
    """Dockerfile text -> instructions: comments dropped (also inside continuations), `\\` lines joined."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        joined = "".join(pending).strip()
        pending = []
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
    if pending:
        raise ValueError("Dockerfile ends inside a line continuation")
    return instructions


_VAR = re.compile(r"\\\$|\$\{(\w+)(?::([-+])([^}]*))?\}|\$(\w+)")


def expand(value: str, env: dict[str, str]) -> str:
    """Docker's variable substitution: $V, ${V}, ${V:-default}, ${V:+alternative}, \\$ for a literal $."""
    def substitute(match: re.Match) -> str:
        if match.group(0) == "\\$":
            return "$"
        current = env.get(match.group(1) or match.group(4), "")
        if match.group(2) == "-":
            return current or match.group(3)
        if match.group(2) == "+":
            return match.group(3) if current else ""
        return current
    return _VAR.sub(substitute, value)


def parse_flags(args: str) -> tuple[dict[str, str], str]:
    """Leading `--name=value` flags of an instruction, and the rest."""
    flags: dict[str, str] = {}
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        args = args.lstrip()
    return flags, args


def exec_or_shell(args: str) -> list[str]:
    """`["a", "b"]` (exec form) or `a b` (shell form, run by /bin/sh -c)."""
    if args.startswith("["):
        try:
            value = json.loads(args)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return ["/bin/sh", "-c", args]


# --- .dockerignore -------------------------------------------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


class DockerIgnore:
    """Docker's .dockerignore: patterns relative to the context root, `!` re-includes, the last match wins;
    a pattern that matches a directory excludes everything under it."""

    def __init__(self, context: Path):
        self.rules: list[tuple[bool, re.Pattern]] = []
        file = context / ".dockerignore"
        if file.exists():
            for raw in file.read_text().splitlines():
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                negate = line.startswith("!")
                pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
                self.rules.append((negate, _pattern_regex(pattern)))

    def excluded(self, relative: str) -> bool:
        parts = relative.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        result = False
        for negate, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                result = not negate
        return result


# --- the build -----------------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    config: dict = field(default_factory=dict)  # ENTRYPOINT, CMD, HEALTHCHECK, EXPOSE, LABEL
    steps: list[dict] = field(default_factory=list)


def du_bytes(path: Path) -> int:
    """Disk use of a root (one file system; hard links once), as `du -sx`."""
    out = subprocess.run(["du", "-sx", "--block-size=1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def base_image(image: str, cache: Path, logfile: Path) -> tuple[Path, dict[str, str]]:
    """The root and ENV of a base image; only `python:3.11[.x]-slim-bookworm` can be made here (see the
    module docstring). Cached under `cache`, like a pulled image."""
    match = re.fullmatch(r"python:(3\.11)(\.\d+)?-slim-(bookworm)(@sha256:[0-9a-f]+)?", image)
    if not match:
        raise RuntimeError(f"FROM {image}: no registry is reachable and only python:3.11[.x]-slim-bookworm "
                           "can be rebuilt here (debootstrap); add a recipe to devkit/image_dockerfile.py")
    suite = match.group(3)
    root = cache / f"python-3.11-slim-{suite}" / "rootfs"
    done = root.parent / "done.json"
    if done.exists():
        return root, json.loads(done.read_text())["env"]
    image_root.remove_root(root.parent)
    root.mkdir(parents=True)
    started = time.monotonic()
    log(f"base {image}: debootstrap --variant=minbase {suite} (once; cached in {root.parent})")
    with open(logfile, "ab") as out:
        subprocess.run(["debootstrap", "--variant=minbase", suite, str(root), DEBIAN_MIRROR],
                       stdout=out, stderr=subprocess.STDOUT, check=True)
    (root / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(SLIM_DPKG_EXCLUDES)
    for line in SLIM_DPKG_EXCLUDES.splitlines():  # what the excludes would have kept out of minbase
        kind, pattern = line.split()
        if kind == "path-exclude":
            for path in glob.glob(str(root) + pattern):
                relative = "/" + os.path.relpath(path, root)
                if not any(fnmatch.fnmatch(relative, keep.split()[1]) for keep in SLIM_DPKG_EXCLUDES.splitlines()
                           if keep.startswith("path-include")):
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(SOURCES.format(suite=suite))
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8"}
    script = ("set -eux; export DEBIAN_FRONTEND=noninteractive; apt-get update; "
              "apt-get install -y --no-install-recommends ca-certificates netbase tzdata python3.11 python3.11-venv; "
              "apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*; "
              "for n in python python3; do ln -sf /usr/bin/python3.11 /usr/local/bin/$n; done; python --version")
    image_root.run(root, ["/bin/sh", "-c", script], env, log=logfile)
    version = subprocess.run(["chroot", str(root), "/usr/bin/python3.11", "-c",
                              "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    env["PYTHON_VERSION"] = version
    done.write_text(json.dumps({"image": image, "env": env, "seconds": round(time.monotonic() - started)}))
    log(f"base ready in {time.monotonic() - started:.0f}s: Debian {suite} minbase + slim excludes + "
        f"Python {version} ({du_bytes(root) / 1e6:.0f} MB)")
    return root, env


class Builder:
    """Builds every stage of one Dockerfile into `out/stages/<name>`; the last stage is the image."""

    def __init__(self, dockerfile: Path, context: Path, out: Path, cache: Path, build_ca: Path | None = None):
        self.dockerfile = dockerfile
        self.context = context
        self.out = out
        self.cache = cache
        self.ignore = DockerIgnore(context)
        self.stages: dict[str, Stage] = {}
        self.logfile = out / "build.log"
        self.build_ca = build_ca

    def build(self) -> Stage:
        image_root.remove_root(self.out / "stages")
        (self.out / "stages").mkdir(parents=True, exist_ok=True)
        instructions = parse(self.dockerfile.read_text())
        args: dict[str, str] = {}
        stage: Stage | None = None
        for instruction in instructions:
            started = time.monotonic()
            log(str(instruction))
            if instruction.keyword == "FROM":
                stage = self._from(instruction.args, args)
            elif instruction.keyword == "ARG":
                name, _, default = instruction.args.partition("=")
                if stage is None:
                    args[name] = default
                else:  # visible to later steps' substitution and RUN (not persisted by Docker; good enough)
                    stage.env.setdefault(name, expand(default, stage.env))
            elif stage is None:
                raise RuntimeError(f"{instruction}: before the first FROM")
            else:
                try:
                    self._step(stage, instruction)
                except Exception as exc:
                    raise RuntimeError(f"{self.dockerfile.name} {instruction}: {exc} (log: {self.logfile})") from exc
            if stage is not None and instruction.keyword in ("RUN", "COPY", "FROM"):
                stage.steps.append({"instruction": str(instruction), "seconds": round(time.monotonic() - started, 1),
                                    "root_bytes": du_bytes(stage.root)})
        if stage is None:
            raise RuntimeError("no FROM in the Dockerfile")
        self._write_config(stage)
        return stage

    def _from(self, args: str, build_args: dict[str, str]) -> Stage:
        flags, rest = parse_flags(args)
        if flags:
            raise RuntimeError(f"FROM flags not supported: {flags}")
        words = expand(rest, build_args).split()
        image = words[0]
        name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(self.stages))
        root = self.out / "stages" / name / "rootfs"
        root.parent.mkdir(parents=True)
        if image in self.stages:
            parent = self.stages[image]
            source, env = parent.root, dict(parent.env)
        else:
            source, env = base_image(image, self.cache, self.logfile)
        subprocess.run(["cp", "-a", "--reflink=auto", str(source), str(root)], check=True)
        stage = Stage(name, root, env=env)
        self.stages[name] = stage
        return stage

    def _step(self, stage: Stage, instruction: Instruction) -> None:
        keyword, args = instruction.keyword, instruction.args
        if keyword == "ENV":
            words = shlex.split(args)
            if words and "=" not in words[0]:  # legacy `ENV key value`
                words = [f"{words[0]}={args.split(None, 1)[1]}"]
            before = dict(stage.env)
            for word in words:
                name, _, value = word.partition("=")
                stage.env[name] = expand(value, before)
        elif keyword == "WORKDIR":
            path = expand(args, stage.env)
            stage.workdir = path if path.startswith("/") else os.path.join(stage.workdir, path)
            (stage.root / stage.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif keyword == "USER":
            stage.user = expand(args, stage.env)
            image_root.resolve_user(stage.root, stage.user)  # fails now if the user does not exist
        elif keyword == "RUN":
            flags, rest = parse_flags(args)
            if flags or rest.startswith("<<"):
                raise RuntimeError("RUN flags and heredocs are not supported")
            with open(self.logfile, "ab") as out:
                out.write(f"\n### {instruction}\n".encode())
            env = dict(stage.env)
            if self.build_ca:  # build-time trust only (see image_root); not in the image's ENV
                env.update({name: image_root.BUILD_CA_PATH for name in BUILD_CA_VARS if name not in env})
            image_root.run(stage.root, exec_or_shell(rest), env, user=stage.user, workdir=stage.workdir,
                           log=self.logfile, build_ca=self.build_ca)
        elif keyword in ("COPY", "ADD"):
            self._copy(stage, keyword, args)
        elif keyword in ("ENTRYPOINT", "CMD"):
            stage.config[keyword] = exec_or_shell(args)
            if keyword == "ENTRYPOINT":
                stage.config.pop("CMD", None)  # Docker resets an inherited CMD when ENTRYPOINT is set
        elif keyword == "HEALTHCHECK":
            flags, rest = parse_flags(args)
            if rest.upper() == "NONE":
                stage.config["HEALTHCHECK"] = None
            else:
                verb, _, command = rest.partition(" ")
                if verb.upper() != "CMD":
                    raise RuntimeError("HEALTHCHECK needs CMD or NONE")
                stage.config["HEALTHCHECK"] = {"test": exec_or_shell(command.strip()), **flags}
        elif keyword == "EXPOSE":
            stage.config.setdefault("EXPOSE", []).extend(expand(args, stage.env).split())
        elif keyword == "LABEL":
            stage.config.setdefault("LABEL", []).append(args)
        elif keyword in ("STOPSIGNAL", "SHELL", "VOLUME", "ONBUILD"):
            raise RuntimeError(f"{keyword} is not supported by this interpreter yet")
        else:
            raise RuntimeError(f"unknown instruction {keyword}")

    def _copy(self, stage: Stage, keyword: str, args: str) -> None:
        flags, rest = parse_flags(args)
        unknown = set(flags) - {"from", "chown", "chmod", "link"}
        if keyword == "ADD" or unknown:
            raise RuntimeError(f"{keyword} with {unknown or 'ADD'} is not supported")
        words = exec_or_shell(rest) if rest.startswith("[") else shlex.split(rest)
        if words[:2] == ["/bin/sh", "-c"]:
            words = shlex.split(rest)
        words = [expand(w, stage.env) for w in words]
        *sources, dest = words
        if not dest.startswith("/"):
            dest = os.path.join(stage.workdir, dest)
        if "from" in flags:
            source_stage = self.stages.get(flags["from"])
            if source_stage is None:
                raise RuntimeError(f"--from={flags['from']}: no such stage (external images are not supported)")
            base, preserve = source_stage.root, True
        else:
            base, preserve = self.context, False
        matches: list[Path] = []
        for source in sources:
            found = sorted(glob.glob(str(base / source.lstrip("/"))))
            found = [f for f in found if preserve or not self.ignore.excluded(os.path.relpath(f, base))]
            if not found:
                where = f"stage {flags['from']}" if preserve else "the build context (after .dockerignore)"
                raise RuntimeError(f"{source}: not found in {where}")
            matches.extend(Path(f) for f in found)
        into_dir = dest.endswith("/") or len(matches) > 1
        target = stage.root / dest.lstrip("/")
        for match in matches:
            if match.is_dir() and not match.is_symlink():
                self._copy_tree(match, target, base, preserve)
            else:
                file_target = target / match.name if into_dir else target
                file_target.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-a", str(match), str(file_target)], check=True)
                if not preserve:
                    os.lchown(file_target, 0, 0)
        owner = flags.get("chown")
        if owner:
            spec = image_root.resolve_user(stage.root, owner)
            subprocess.run(["chown", "-R", "-h", spec, str(target)], check=True)
        if flags.get("chmod"):
            subprocess.run(["chmod", "-R", flags["chmod"], str(target)], check=True)

    def _copy_tree(self, source: Path, target: Path, base: Path, preserve: bool) -> None:
        """A directory's contents into `target`; context copies skip .dockerignore'd paths and are owned by root."""
        target.mkdir(parents=True, exist_ok=True)
        if preserve:
            subprocess.run(["cp", "-a", f"{source}/.", str(target)], check=True)
            return
        for directory, dirs, files in os.walk(source):
            relative_dir = os.path.relpath(directory, base)
            dirs[:] = [d for d in dirs if not self.ignore.excluded(os.path.join(relative_dir, d))]
            into = target / os.path.relpath(directory, source)
            into.mkdir(parents=True, exist_ok=True)
            os.chown(into, 0, 0)
            for name in files:
                if not self.ignore.excluded(os.path.join(relative_dir, name)):
                    shutil.copy2(os.path.join(directory, name), into / name, follow_symlinks=False)
                    os.lchown(into / name, 0, 0)

    def _write_config(self, stage: Stage) -> None:
        config = {"stage": stage.name, "env": stage.env, "workdir": stage.workdir, "user": stage.user,
                  "entrypoint": stage.config.get("ENTRYPOINT", []), "cmd": stage.config.get("CMD", []),
                  "healthcheck": stage.config.get("HEALTHCHECK"), "expose": stage.config.get("EXPOSE", []),
                  "labels": stage.config.get("LABEL", []),
                  "stages": {s.name: {"root": str(s.root), "steps": s.steps} for s in self.stages.values()}}
        (self.out / "image.json").write_text(json.dumps(config, indent=2))
