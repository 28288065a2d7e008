"""Image rehearsal without Docker: build the Dockerfile's root filesystem, start the service from it, check it.

    .venv/bin/python -m devkit.image_build [--out /work/image-build] [--skip-build] [--modes docker,any-uid]

1. build: devkit.image_dockerfile interprets the repository's Dockerfile (every stage) into
   `<out>/stages/<stage>/rootfs`, with the base image rebuilt by debootstrap and cached in `<out>/cache`.
2. check, for each mode, against a noida-db broker and a local EMS endpoint started here (stopped by PID):
   - `docker`: the image as `docker run` starts it: its ENTRYPOINT, ENV, WORKDIR and USER, writable root;
   - `kubernetes`: as deploy/kubernetes starts it: configmap.yaml's settings, HOME=/tmp, a read-only root
     and an empty /tmp (the emptyDir);
   - `any-uid`: as `docker run --user 1000680000:0`: an arbitrary uid in group 0 that the image's
     /etc/passwd does not know (OpenShift's restricted SCC);
   - `openshift`: the Kubernetes manifests on OpenShift: as `kubernetes`, but as that arbitrary uid.
   Without a passwd entry the JVM cannot log in ("Invalid UID, could not determine effective user"):
   the image's entrypoint must give the uid one (nss_wrapper); an image user that has an entry needs none.
   The service must answer /healthz and /readyz (the probes' paths), pass the image's HEALTHCHECK, run as
   the mode's uid, deliver every key's latest version to the endpoint, write its scratch files as that
   uid, commit up to the end of the topic and exit 0 on SIGTERM.
3. report sizes (du of the final stage's root: everything it ships; the builder stage too) to
   `<out>/report.json`. Any failure exits 1. Slow (minutes), so it is a rehearsal, not a pytest test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from devkit import image_buildah, image_root
from devkit.brokers import free_port, running_broker
from devkit.image_dockerfile import Builder, du_bytes, log
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from local_ems.server import LocalEmsServer

REPO = Path(__file__).resolve().parents[1]
AUTHORIZATION = "AppKey image-rehearsal-key"
PARTITIONS = 3
KEYS, UPDATES = 300, 4
STARTUP_BUDGET_S = 120  # deployment.yaml startupProbe: failureThreshold 24 x periodSeconds 5
DELIVERY_BUDGET_S = 180
GRACE_S = 45  # deployment.yaml terminationGracePeriodSeconds
# OpenShift's first uid of a project's range (restricted SCC), with group 0; not in the image's /etc/passwd.
ANY_UID = "1000680000:0"
MODES = ("docker", "kubernetes", "any-uid", "openshift")


class CheckFailed(Exception):
    pass


def probe(port: int, path: str) -> int | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}{path}", timeout=3).status_code
    except requests.RequestException:
        return None


def wait_for(condition, budget_s: float, what: str, process, logfile: Path) -> float:
    """Seconds until `condition()` holds; fails if the process exits or the budget runs out."""
    started = time.monotonic()
    while time.monotonic() - started < budget_s:
        if condition():
            return time.monotonic() - started
        if process.poll() is not None:
            raise CheckFailed(f"service exited {process.returncode} while waiting for {what}; log tail:\n"
                              + logfile.read_text(errors="replace")[-4000:])
        time.sleep(0.5)
    raise CheckFailed(f"no {what} within {budget_s}s; log tail:\n" + logfile.read_text(errors="replace")[-4000:])


def jvm_archives(pgid: int) -> list[str]:
    """Class-data archives (.jsa) mapped by the java processes of a process group."""
    found: set[str] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or "java" not in stat.read_text().split(")")[0]:
                continue
            maps = (stat.parent / "maps").read_text()
        except (OSError, IndexError, ValueError):
            continue
        found.update(line.split()[-1] for line in maps.splitlines() if line.endswith(".jsa"))
    return sorted(found)


def kubernetes_env() -> dict[str, str]:
    """configmap.yaml's settings and deployment.yaml's env (HOME), as a pod gets them."""
    configmap = yaml.safe_load((REPO / "deploy/kubernetes/configmap.yaml").read_text())["data"]
    env = {k: str(v) for k, v in configmap.items()}
    deployment = yaml.safe_load((REPO / "deploy/kubernetes/deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env.update({e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    # The test broker has no authentication (item 1 of issue 27 covers SASL/TLS).
    for name in ("SINK_KAFKA_SECURITY_PROTOCOL", "SINK_KAFKA_SASL_MECHANISM", "SINK_KAFKA_SASL_USERNAME"):
        env.pop(name, None)
    return env


def passwd_home(root: Path, uid: str) -> str | None:
    """The home directory of `uid` in the image's /etc/passwd; None without an entry."""
    for line in (root / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 5 and parts[2] == uid:
            return parts[5]
    return None


def process_environ(pid: int) -> dict[str, str]:
    """The environment a running process was started with (/proc/<pid>/environ)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)


def check_passwd_entry(pid: int, uid: str, has_entry: bool) -> str:
    """The service's uid has a user name for the JVM: the image's own entry, or nss_wrapper's from the entrypoint."""
    environ = process_environ(pid)
    preload, wrapped = environ.get("LD_PRELOAD", ""), environ.get("NSS_WRAPPER_PASSWD")
    if has_entry:
        if "nss_wrapper" in preload:
            raise CheckFailed(f"uid {uid} has an entry in /etc/passwd, yet the entrypoint preloaded nss_wrapper")
        return "the image's /etc/passwd"
    if "libnss_wrapper.so" not in preload or not wrapped:
        raise CheckFailed(f"uid {uid} has no passwd entry and the service runs without nss_wrapper "
                          f"(LD_PRELOAD={preload!r}): the JVM's login fails with 'Invalid UID'")
    lines = [line for line in Path(f"/proc/{pid}/root{wrapped}").read_text().splitlines()
             if line.split(":")[2:3] == [uid]]
    if len(lines) != 1:
        raise CheckFailed(f"{wrapped} has {len(lines)} lines for uid {uid}")
    return f"nss_wrapper ({preload}): {wrapped} adds {lines[0]}"


def check_mode(mode: str, image: dict, root: Path, bootstrap: str, topic: str, workload: Workload,
               ems: LocalEmsServer, out: Path) -> dict:
    kubernetes = mode in ("kubernetes", "openshift")
    if mode in ("any-uid", "openshift"):  # `docker run --user N:0`, OpenShift's restricted SCC
        image = {**image, "user": ANY_UID}
    uid = image_root.resolve_user(root, image["user"]).split(":")[0]
    port = free_port()  # the host's network is shared, so not the image's 8080
    group, table = f"image-rehearsal-{mode}", f"image_{mode.replace('-', '_')}"
    env = dict(image["env"])
    # Docker sets HOME to the user's passwd entry's home, or to / for a uid without one.
    env.setdefault("HOME", passwd_home(root, uid) or "/")
    if kubernetes:
        env.update(kubernetes_env())
    env.update({
        "SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_GROUP_ID": group,
        "SINK_EMS_ENDPOINT": ems.items_url(), "SINK_EMS_AUTHORIZATION": AUTHORIZATION,
        "SINK_EMS_TARGET_TABLE": table, "SINK_PRIMARY_KEYS": "id", "SINK_FLUSH_INTERVAL_MS": "2000",
        "SINK_HTTP_PORT": str(port), "SINK_SHUTDOWN_TIMEOUT_MS": "20000", "HOSTNAME": f"image-{mode}",
    })
    argv = image["entrypoint"] + image["cmd"]
    logfile = out / f"service-{mode}.log"
    logfile.unlink(missing_ok=True)
    log(f"[{mode}] start {argv} as USER {image['user']} in WORKDIR {image['workdir']}"
        + (" (read-only root, empty /tmp)" if kubernetes else ""))
    started = time.monotonic()
    # docker: a fresh writable layer over the image (overlayfs); kubernetes: the image root itself, read-only.
    container = None if kubernetes else out / "containers" / mode
    if container is not None:
        image_root.remove_root(container)
    process = image_root.start(root, argv, env, user=image["user"], workdir=image["workdir"], log=logfile,
                               kubernetes=kubernetes, container=container)
    seen_root = container / "rootfs" if container else root  # the root as the container sees it
    result: dict = {"mode": mode, "log": str(logfile)}
    try:
        result["healthz_s"] = round(wait_for(lambda: probe(port, "/healthz") == 200, STARTUP_BUDGET_S,
                                             "200 from /healthz", process, logfile), 1)
        result["readyz_s"] = round(time.monotonic() - started + wait_for(
            lambda: probe(port, "/readyz") == 200, STARTUP_BUDGET_S, "200 from /readyz", process, logfile), 1)
        log(f"[{mode}] /healthz 200 after {result['healthz_s']}s, /readyz 200 after {result['readyz_s']}s")

        expected = workload.expected_rows(topic)

        def delivered() -> bool:
            rows = {r["id"]: r for r in ems.table(table)} if ems.count(table) else {}
            return len(rows) == len(expected) and all(rows[k]["version"] == v["version"]
                                                      for k, v in expected.items() if k in rows)
        result["delivered_s"] = round(time.monotonic() - started + wait_for(
            delivered, DELIVERY_BUDGET_S, f"all {len(expected)} keys' latest versions at the endpoint",
            process, logfile), 1)
        ends = end_offsets(bootstrap, topic, PARTITIONS)
        result["committed_s"] = round(time.monotonic() - started + wait_for(
            lambda: committed_offsets(bootstrap, group, topic, PARTITIONS) == ends, DELIVERY_BUDGET_S,
            f"commits up to the end offsets {ends}", process, logfile), 1)
        result["uploads"] = len(ems.uploads(table))
        log(f"[{mode}] {len(expected)} keys, latest versions, at the endpoint after {result['delivered_s']}s "
            f"({result['uploads']} uploads), committed to the end after {result['committed_s']}s")

        uids = {line.split()[1] for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
                if line.startswith("Uid:")}
        want_uid = uid
        if uids != {want_uid}:
            raise CheckFailed(f"the service runs as uid {uids}, not the mode's user {image['user']}")
        result["uid"] = image["user"]
        result["user_name"] = check_passwd_entry(process.pid, uid, passwd_home(root, uid) is not None)
        log(f"[{mode}] uid {image['user']}, user name from {result['user_name']}")

        # The image's spark_home layer (a class archive, ~150 MB) is only worth shipping if the JVM maps it.
        archives = jvm_archives(process.pid)
        if not archives:
            raise CheckFailed("the service's JVM maps no class archive (.jsa): the spark_home layer is unused")
        result["jvm_class_archives"] = archives
        prefix = str(seen_root.resolve())
        log(f"[{mode}] the JVM maps {', '.join(a.removeprefix(prefix) for a in archives)}")

        health = image.get("healthcheck")
        if health:
            done = image_root.exec_in(process.pid, seen_root, health["test"], env, user=image["user"],
                                      workdir=image["workdir"])
            if done.returncode != 0:
                raise CheckFailed(f"HEALTHCHECK {health['test']} exited {done.returncode}: {done.stderr[-800:]}")
            result["healthcheck"] = "exit 0"
            log(f"[{mode}] the image's HEALTHCHECK exits 0")

        scratch = env["SINK_SCRATCH_DIR"]
        written = [p for p in Path(f"/proc/{process.pid}/root{scratch}").rglob("*")]
        owners = sorted({p.lstat().st_uid for p in written})
        check = ("import os, sys, tempfile; d = os.environ['SINK_SCRATCH_DIR']; "
                 "f = tempfile.NamedTemporaryFile(dir=d); f.write(b'x'); f.flush(); "
                 "print(os.getuid(), oct(os.stat(d).st_mode & 0o7777), os.stat(d).st_uid)")
        done = image_root.exec_in(process.pid, seen_root, ["python", "-c", check], env, user=image["user"],
                                  workdir=image["workdir"])
        if done.returncode != 0:
            raise CheckFailed(f"{scratch} is not writable by {image['user']}: {done.stderr[-800:]}")
        if not written or owners != [int(want_uid)]:
            raise CheckFailed(f"the service wrote {len(written)} paths under {scratch}, owned by uids {owners}")
        mode_owner = " ".join(done.stdout.split()[1:])
        result["scratch"] = f"{scratch} (mode, uid {mode_owner}): {len(written)} paths written by uid {owners}"
        log(f"[{mode}] {result['scratch']}")
        if kubernetes:
            done = image_root.exec_in(process.pid, seen_root, ["python", "-c", "open('/opt/venv/probe', 'w')"], env,
                                      user="0:0", workdir="/")
            if done.returncode == 0:
                raise CheckFailed("the root filesystem was writable: the read-only emulation does not hold")
            result["read_only_root"] = "a write to /opt/venv fails (even as root), as readOnlyRootFilesystem"

        log(f"[{mode}] SIGTERM")
        os.kill(process.pid, signal.SIGTERM)
        try:
            code = process.wait(GRACE_S)
        except Exception as exc:
            raise CheckFailed(f"no exit within terminationGracePeriodSeconds {GRACE_S}s") from exc
        if code != 0:
            raise CheckFailed(f"exit {code} on SIGTERM; log tail:\n" + logfile.read_text(errors="replace")[-3000:])
        committed = committed_offsets(bootstrap, group, topic, PARTITIONS)
        if committed != ends:
            raise CheckFailed(f"after SIGTERM: committed {committed}, end of topic {ends}")
        result["exit"] = 0
        result["committed"] = "to the end of every partition"
        log(f"[{mode}] exit 0 on SIGTERM; committed {committed} = end offsets")
        return result
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # anything left of the group (a JVM)


def check(image: dict, root: Path, out: Path, modes: list[str]) -> list[dict]:
    results = []
    ems_dir = out / "ems"
    shutil.rmtree(ems_dir, ignore_errors=True)  # a fresh endpoint: rows of an earlier run must not count
    with running_broker("noida") as bootstrap, LocalEmsServer(ems_dir, AUTHORIZATION) as ems:
        topic = "image-rehearsal-orders"
        create_topics(bootstrap, {topic: PARTITIONS})
        workload = Workload()
        produced = produce_orders(bootstrap, topic, keys=KEYS, updates=UPDATES, workload=workload)
        log(f"broker {bootstrap}, endpoint {ems.items_url()}, {produced} records for {KEYS} keys in {topic}")
        for mode in modes:
            results.append(check_mode(mode, image, root, bootstrap, topic, workload, ems, out))
    return results


def export_context(ref: str, dockerfile: Path, out: Path) -> Path:
    """`git archive <ref>` into <out>/context; returns the Dockerfile path there."""
    context = out / "context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(context)], input=archive, check=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], capture_output=True, text=True,
                            check=True).stdout.strip()
    log(f"build context: git archive {ref} ({commit})")
    return context / dockerfile.relative_to(REPO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.image_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/work/image-build"), help="build outputs (outside the repo)")
    parser.add_argument("--dockerfile", type=Path, default=REPO / "Dockerfile")
    parser.add_argument("--skip-build", action="store_true", help="check the root built last time")
    parser.add_argument("--fresh-base", action="store_true", help="debootstrap the base image again")
    parser.add_argument("--build-ca", default=os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE"),
                        help="the build host's CA bundle for RUN steps only, when egress re-signs TLS "
                             "(default: $PIP_CERT or $SSL_CERT_FILE; '' for none)")
    parser.add_argument("--git-ref", help="build from `git archive REF` (e.g. HEAD) instead of the working tree, "
                                          "which other people's uncommitted edits may change")
    parser.add_argument("--builder", choices=("interpreter", "buildah"), default="interpreter",
                        help="interpreter: devkit/image_dockerfile.py (default); buildah: `buildah bud` on the same "
                             "base, its image's root and config then checked the same way")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all; see the module docstring)")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {', '.join(MODES)}")
    if os.geteuid() != 0:
        parser.error("needs root (debootstrap, chroot, mount namespaces)")
    out: Path = args.out.resolve()
    if out == REPO or REPO in out.parents:
        parser.error(f"--out {out} is inside the repository; never build a root filesystem there")
    out.mkdir(parents=True, exist_ok=True)
    if args.fresh_base:
        image_root.remove_root(out / "cache")
    report: dict = {"dockerfile": str(args.dockerfile), "builder": args.builder, "git_ref": args.git_ref}
    started = time.monotonic()
    try:
        if not args.skip_build:
            (out / "build.log").unlink(missing_ok=True)
            build_ca = Path(args.build_ca) if args.build_ca else None
            if args.git_ref:
                args.dockerfile = export_context(args.git_ref, args.dockerfile, out)
            if args.builder == "buildah":
                image_buildah.build(args.dockerfile, out, build_ca)
            else:
                Builder(args.dockerfile, args.dockerfile.parent, out, out / "cache", build_ca).build()
            report["build_s"] = round(time.monotonic() - started)
            log(f"built in {report['build_s']}s (log {out / 'build.log'})")
        image = json.loads((out / "image.json").read_text())
        root = Path(image["stages"][image["stage"]]["root"])
        report["sizes_mb"] = {name: round(du_bytes(Path(s["root"])) / 1e6) for name, s in image["stages"].items()}
        report["image_mb"] = report["sizes_mb"][image["stage"]]
        report["layers"] = image["stages"][image["stage"]]["steps"]
        log(f"image (final stage {image['stage']!r}) {report['image_mb']} MB; stages {report['sizes_mb']}")
        report["checks"] = check(image, root, out, args.modes.split(","))
        report["result"] = "ok"
    except Exception as exc:
        report["result"] = f"FAILED: {exc}"
    report["wall_s"] = round(time.monotonic() - started)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    log(f"{report['result']}\n  after {report['wall_s']}s; report {out / 'report.json'}")
    return 0 if report["result"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
