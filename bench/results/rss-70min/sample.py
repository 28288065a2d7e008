"""Sample the service's process tree RSS every 30 s and the JVM's native memory summary every 300 s.

    python sample.py BENCH_PID OUT_DIR SECONDS   (the JVM needs -XX:NativeMemoryTracking=summary)
"""

import json
import os
import subprocess
import sys
import time

import psutil


def main() -> None:
    root, outdir, seconds = psutil.Process(int(sys.argv[1])), sys.argv[2], float(sys.argv[3])
    start, last_nmt = time.time(), -1e9
    with open(os.path.join(outdir, "rss.jsonl"), "a") as out:
        while time.time() - start < seconds:
            services = []
            for p in root.children(recursive=True):
                try:
                    if p.cmdline()[1:3] == ["-m", "sink_service"]:
                        services.append(p)
                except (psutil.Error, IndexError):
                    continue
            for service in services[:1]:
                kinds: dict[str, int] = {}
                jvm = None
                for p in [service, *service.children(recursive=True)]:
                    try:
                        rss, name = p.memory_info().rss, p.name()
                    except psutil.Error:
                        continue
                    kind = "jvm" if "java" in name else ("main" if p.pid == service.pid else "python")
                    jvm = p if kind == "jvm" else jvm
                    kinds[kind] = kinds.get(kind, 0) + rss
                t = round(time.time() - start)
                out.write(json.dumps({"t": t, "rss_mb": round(sum(kinds.values()) / 2**20),
                                      "by_kind_mb": {k: round(v / 2**20) for k, v in kinds.items()}}) + "\n")
                out.flush()
                if jvm is not None and time.time() - last_nmt >= 300:
                    last_nmt = time.time()
                    jcmd = os.path.join(os.path.dirname(os.readlink(f"/proc/{jvm.pid}/exe")), "jcmd")
                    done = subprocess.run([jcmd, str(jvm.pid), "VM.native_memory", "summary"], capture_output=True,
                                          text=True, timeout=60, check=False)
                    with open(os.path.join(outdir, "jvm-nmt.txt"), "a") as nmt:
                        nmt.write(f"=== t={t}\n{done.stdout}\n")
            time.sleep(30)


if __name__ == "__main__":
    main()
