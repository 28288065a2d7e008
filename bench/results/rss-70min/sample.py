"""Sample the service's process tree RSS every 30 s; the JVM's NMT summary every 300 s."""
import json, os, subprocess, sys, time
import psutil
root = psutil.Process(int(sys.argv[1]))
outdir = sys.argv[2]
out = open(os.path.join(outdir, "rss.jsonl"), "a")
start = time.time()
last_nmt = -1e9
while time.time() - start < float(sys.argv[3]):
    services = []
    for p in root.children(recursive=True):
        try:
            if p.cmdline()[1:3] == ["-m", "sink_service"]:
                services.append(p)
        except (psutil.Error, IndexError):
            continue
    for s in services[:1]:
        rss = 0
        kinds = {}
        jvm = None
        for p in [s, *s.children(recursive=True)]:
            try:
                r = p.memory_info().rss
                name = p.name()
            except psutil.Error:
                continue
            rss += r
            kind = "jvm" if "java" in name else ("main" if p.pid == s.pid else "python")
            if kind == "jvm":
                jvm = p
            kinds[kind] = kinds.get(kind, 0) + r
        t = round(time.time() - start)
        out.write(json.dumps({"t": t, "rss_mb": round(rss / 2**20),
                              "by_kind_mb": {k: round(v / 2**20) for k, v in kinds.items()}}) + "\n")
        out.flush()
        if jvm is not None and time.time() - last_nmt >= 300:
            last_nmt = time.time()
            try:
                jcmd = os.path.join(os.path.dirname(os.readlink(f"/proc/{jvm.pid}/exe")), "jcmd")
                text = subprocess.run([jcmd, str(jvm.pid), "VM.native_memory", "summary"], capture_output=True,
                                      text=True, timeout=60).stdout
            except Exception as exc:  # noqa: BLE001
                text = f"error {exc}"
            with open(os.path.join(outdir, "nmt.txt"), "a") as f:
                f.write(f"=== t={t}\n{text}\n")
    time.sleep(30)
