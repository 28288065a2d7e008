"""results.json, results.md and results.png from the measured runs."""

from __future__ import annotations

import json
from pathlib import Path

# Rows both reports end with: what ran beside the system, what it wrote, how busy the machine was.
MEANWHILE_ROWS = [
    ("broker_cpu_s", "CPU seconds meanwhile: broker [3]", "{:.1f}"),
    ("endpoint_cpu_s", "CPU seconds meanwhile: endpoint [3]", "{:.1f}"),
    ("harness_cpu_s", "CPU seconds meanwhile: the benchmark's own process [3]", "{:.1f}"),
]
OUTPUT_AND_LOAD_ROWS = [
    ("files", "files", "{:d}"),
    ("mean_file_mb", "mean file size (MB)", "{:.2f}"),
    ("rows_in_files", "rows in files", "{:,d}"),
    ("endpoint_rows", "rows in the endpoint table (distinct keys)", "{:,d}"),
    ("other_load_cores", "other load on the machine (cores busy) [2]", "{:.2f}"),
    ("steal_cores", "CPU taken by other virtual machines (steal, cores) [2]", "{:.2f}"),
]
BUSY_BEFORE_ROW = ("busy_cores_before", "machine busy at the start (cores) [4]", "{:.2f}")

ROWS = [  # (key in a system's result, label, format)
    ("records_per_s", "records/s, start to last commit", "{:,.0f}"),
    ("mb_per_s", "MB/s, start to last commit", "{:.2f}"),
    ("after_first_commit_records_per_s", "records/s after the first commit", "{:,.0f}"),
    ("after_first_commit_mb_per_s", "MB/s after the first commit", "{:.2f}"),
    ("first_commit_s", "time to first commit (s)", "{:.1f}"),
    ("last_commit_s", "time to last commit (s)", "{:.1f}"),
    ("latency_p50_s", "latency p50, produce->upload (s) [1]", "{:.1f}"),
    ("latency_p99_s", "latency p99, produce->upload (s) [1]", "{:.1f}"),
    ("peak_rss_mb", "peak RSS, whole process tree (MB)", "{:,.0f}"),
    ("peak_processes", "processes in the tree (max)", "{:d}"),
    ("cpu_s", "CPU seconds, whole process tree", "{:.1f}"),
    ("cpu_s_per_m_records", "CPU seconds per million records", "{:.1f}"),
    *MEANWHILE_ROWS,
    *OUTPUT_AND_LOAD_ROWS,
    ("rested_s", "rest before the start, until the machine was quiet (s) [4]", "{:.0f}"),
    BUSY_BEFORE_ROW,
]
RATIOS = [  # (key, label, higher is better)
    ("records_per_s", "throughput, start to last commit", True),
    ("after_first_commit_records_per_s", "throughput after the first commit", True),
    ("first_commit_s", "time to first commit", False),
    ("latency_p50_s", "latency p50", False),
    ("latency_p99_s", "latency p99", False),
    ("peak_rss_mb", "peak RSS", False),
    ("cpu_s", "CPU seconds", False),
]


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "—"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def ratio(a, b) -> float | None:
    return None if a is None or b in (None, 0) else a / b


LIVE_ROWS = [  # (key, label, format) of a live run
    ("rate_produced", "produce rate reached (records/s)", "{:,.0f}"),
    ("records", "records", "{:,d}"),
    ("startup_s", "start-up: process start to first record produced (s) [5]", "{:.1f}"),
    ("cpu_s_per_m_records", "CPU seconds per million records, whole tree [6]", "{:.2f}"),
    ("cpu_s_per_m_records_without_fetch", "... without librdkafka's broker (fetch) threads [6]", "{:.2f}"),
    ("fetch_cpu_s_per_m_records", "... of which librdkafka's broker threads", "{:.2f}"),
    ("latency_p50_s", "latency p50, produce->upload or file write (s) [7]", "{:.2f}"),
    ("latency_p99_s", "latency p99, produce->upload or file write (s) [7]", "{:.2f}"),
    ("drain_s", "last commit after the last record produced (s)", "{:.1f}"),
    ("peak_rss_mb", "peak RSS, whole process tree, start-up included (MB)", "{:,.0f}"),
    ("peak_processes", "processes in the tree (max)", "{:d}"),
    *MEANWHILE_ROWS,
    ("producer_cpu_s", "CPU seconds meanwhile: producer", "{:.1f}"),
    *OUTPUT_AND_LOAD_ROWS,
    BUSY_BEFORE_ROW,
]
LIVE_RATIOS = [
    ("cpu_s_per_m_records", "CPU per million records", False),
    ("cpu_s_per_m_records_without_fetch", "CPU per million records without fetch threads", False),
    ("latency_p50_s", "latency p50", False),
    ("latency_p99_s", "latency p99", False),
    ("peak_rss_mb", "peak RSS", False),
]
PEERS = ("pathway", "quix", "handwritten")


def ratios(systems: dict[str, dict], keys: list[tuple[str, str, bool]] = RATIOS) -> dict[str, dict[str, float | None]]:
    """service / each peer present (and service+sql / service), for every key."""
    service = systems.get("service")
    out: dict[str, dict[str, float | None]] = {}
    if not service:
        return out
    pairs = [("service", other) for other in PEERS if other in systems]
    if "service+sql" in systems:
        pairs.append(("service+sql", "service"))
    if "delta" in systems:
        pairs.append(("delta", "service"))
    for a, b in pairs:
        out[f"{a}/{b}"] = {key: ratio(systems[a].get(key), systems[b].get(key)) for key, _, _ in keys}
    return out


def _ratio_table(table: dict, keys: list[tuple[str, str, bool]]) -> list[str]:
    if not table:
        return []
    lines = ["", "Ratios (service divided by peer; throughput: >1 means the service is faster; time, "
                 "latency, memory, CPU: <1 means the service needs less):", "",
             "| | " + " | ".join(table) + " |", "|---|" + "---:|" * len(table)]
    for key, label, _ in keys:
        lines.append(f"| {label} | " + " | ".join(_fmt(table[c].get(key), "{:.2f}x") for c in table) + " |")
    return lines


def live_run_markdown(run: dict, heading: str = "###") -> str:
    systems = run["systems"]
    names = list(systems)
    w = run["workload"]
    lines = [
        f"{heading} Live: {run['rate']:,} records/s for {run['seconds']:.0f} s ({run['records']:,} records x "
        f"{w['record_size']} B, {w['partitions']} partitions, {w['keys']:,} keys), each system on its own topic",
        "",
        "| | " + " | ".join(systems[n]["label"] for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for key, label, fmt in LIVE_ROWS:
        lines.append(f"| {label} | " + " | ".join(_fmt(systems[n].get(key), fmt) for n in names) + " |")
    for n in names:
        kinds = systems[n].get("cpu_s_by_process_kind")
        if kinds and len(kinds) > 1 and systems[n].get("records"):
            per_m = systems[n]["records"] / 1e6
            lines += ["", f"{systems[n]['label']}: CPU seconds per million records by process: " + ", ".join(
                f"{kind} {seconds / per_m:.2f}" for kind, seconds in sorted(kinds.items()))
                + "; peak RSS by process (MB): " + ", ".join(
                f"{kind} {mb:,}" for kind, mb in sorted(systems[n].get("peak_rss_mb_by_process_kind", {}).items()))
                + "."]
    errors = [f"- **{systems[n]['label']}** failed: {systems[n]['error']}" for n in names if systems[n].get("error")]
    if errors:
        lines += ["", *errors]
    lines += _ratio_table(run.get("ratios", {}), LIVE_RATIOS)
    return "\n".join(lines)


def run_markdown(run: dict, heading: str = "###") -> str:
    if run.get("mode") == "live":
        return live_run_markdown(run, heading)
    systems = run["systems"]
    names = list(systems)
    w = run["workload"]
    lines = [
        f"{heading} {w['records']:,} records x {w['record_size']} B, {w['partitions']} partitions, "
        f"{w['keys']:,} keys (topic `{run['topic']}`)",
        "",
        f"Produced in {run['produce_s']:.1f}s ({run['records'] / run['produce_s']:,.0f} records/s), "
        f"{run['payload_bytes'] / 1e6:.1f} MB of keys and values."
        + (f" Flush threshold {run['flush_records']:,} records per partition." if run.get("flush_records") else ""),
        "",
        "| | " + " | ".join(systems[n]["label"] for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for key, label, fmt in ROWS:
        lines.append(f"| {label} | " + " | ".join(_fmt(systems[n].get(key), fmt) for n in names) + " |")
    phases = systems.get("service", {}).get("phases")
    if phases and "first_batch_started_s" in phases:
        service = systems["service"]
        lines += ["", f"Service timeline (seconds since process start): Python logging at "
                      f"{phases.get('python_started_s', '?')}, Spark session up at {phases.get('spark_up_s', '?')}, "
                      f"streaming query started at {phases.get('query_started_s', '?')}, first micro-batch started "
                      f"at {phases['first_batch_started_s']} and took {phases['first_batch_s']}; "
                      f"{phases['batches']} micro-batch(es) logged, {phases['batch_s_total']}s in total."
                  + (f" Uploads: {service['uploads']:.0f} taking {service['upload_seconds_total']:.1f}s summed."
                     if service.get("uploads") else "")
                  + (" CPU seconds by process: " + ", ".join(
                      f"{kind} {seconds:.1f}" for kind, seconds in sorted(service["cpu_s_by_process_kind"].items()))
                     + "." if service.get("cpu_s_by_process_kind") else "")
                  + (" Peak RSS by process (MB): " + ", ".join(
                      f"{kind} {mb:,}" for kind, mb in sorted(service["peak_rss_mb_by_process_kind"].items()))
                     + "." if service.get("peak_rss_mb_by_process_kind") else "")]
    errors = [f"- **{systems[n]['label']}** failed: {systems[n]['error']}" for n in names if systems[n].get("error")]
    if errors:
        lines += ["", *errors]
    lines += _ratio_table(run.get("ratios", {}), RATIOS)
    return "\n".join(lines)


NOTES = """\
[1] Every system consumes a backlog produced before it started (and before the systems that ran
earlier), so latency is measured from max(produce timestamp, system start) to the file's arrival: for
the service and the hand-written pipeline the endpoint's `received_at` of the file holding the record,
for Quix the file's mtime on local disk, for Pathway the first 0.1-0.2 s poll that saw the line in its
output file. The raw produce->upload figures are in results.json.
[2] CPU time of processes other than the system, the benchmark, the endpoint and the broker,
divided by the system's wall time: a CI run sharing the machine shows up here. Steal is CPU time the
hypervisor gave to other virtual machines while this one wanted it (the `st` of `top`); on a 2-core VM
0.5 cores of steal slows every system by about a quarter, and not evenly over a run.
[3] CPU used during the system's run by the broker (serving fetches and commits; noida-db also saves its whole
state, about 4 CPU-s per 1M records, at most every ~6 s while offsets are committed), by the endpoint's
process (multipart parsing, Parquet decoding, SQLite upsert) and by the benchmark process (sampling, offset
polls): part of the cost of a run, not counted in the system's own CPU seconds. Until 29 Nov 2026 (sixth
round) the endpoint's row summed the endpoint and the benchmark process.
[4] Before each system the benchmark waits until the whole machine is quiet (busy below --quiet-cores
for 2 s). noida-db keeps a full core busy for about 12 s after 2M records are produced; with a fixed
pause, the system that runs first would share the machine with that work.

[5] Live mode: the producer starts once the system is up (its librdkafka consumer exists; the service: its
streaming query has started) plus --live-settle seconds; everything before is start-up, excluded from CPU.
[6] Live mode: user + system CPU of every process of the system (JVM and Python workers included) from the
first record produced to the last commit (Pathway: last line written). librdkafka's broker threads
(`rdk:broker*`, the fetch I/O) are also counted on their own: on noida-db an idle consumer's fetch loop
spins (about 0.5 cores for Pathway between batches), so "without" is the figure that shows the work.
[7] Live mode: per record, the arrival of its file at the endpoint (service, hand-written) or the time it
was on disk (Quix: file mtime; Pathway: the 0.1 s poll that first saw its line) minus its Kafka timestamp
(produce time).

Only the service and the hand-written pipeline push each file to the EMS-compatible endpoint (which
parses it and upserts it into SQLite in a process of its own, on the same cores); Quix writes local
Parquet files and Pathway a local JSON Lines file, and neither pushes anything. Pathway's group offsets
follow what it has read (librdkafka auto-commit), not what it has written: its "commits" here are lines in
its output file. Compare ratios, not absolute numbers: the machine is shared and noisy."""

GIB_1_5 = 1.5 * 1024  # MB (MiB): the peak RSS target


def _verdict(value: float | None, limit: float, higher_is_better: bool, fmt: str) -> str:
    if value is None:
        return "not measured"
    met = value >= limit if higher_is_better else value <= limit
    return f"{'met' if met else 'NOT met'} ({fmt.format(value)})"


def targets_markdown(result: dict) -> str:
    """Issue #13's targets, met or not, with the number, per run."""
    lines = ["### Targets (issue #13)", "", "| run | target | result |", "|---|---|---|"]
    for run in result["runs"]:
        systems, table = run["systems"], run.get("ratios", {})
        service = systems.get("service", {})
        if run.get("mode") == "live":
            name = f"live {run['rate']:,}/s"
            hw = table.get("service/handwritten", {})
            # librdkafka's fetch threads spin on noida-db for the hand-written consumer, not for the
            # service's range readers: the target is judged without them, the whole tree is shown.
            rows = [
                ("CPU per million <= 1.2x hand-written (without librdkafka's fetch threads)",
                 _verdict(hw.get("cpu_s_per_m_records_without_fetch"), 1.2, False, "{:.2f}x")),
                ("... whole tree, fetch threads included (not comparable on noida-db)",
                 _verdict(hw.get("cpu_s_per_m_records"), 1.2, False, "{:.2f}x")),
                ("p99 latency no worse than hand-written", _verdict(hw.get("latency_p99_s"), 1.0, False, "{:.2f}x")
                 + f": {_fmt(service.get('latency_p99_s'), '{:.2f}')} s vs "
                 f"{_fmt(systems.get('handwritten', {}).get('latency_p99_s'), '{:.2f}')} s"),
                ("peak RSS <= 1.5 GiB", _verdict(service.get("peak_rss_mb"), GIB_1_5, False, "{:,.0f} MB")),
            ]
        else:
            name = f"backlog {run['records']:,}"
            rows = [
                ("start -> last commit >= 1.0x Pathway",
                 _verdict(table.get("service/pathway", {}).get("records_per_s"), 1.0, True, "{:.2f}x")),
                ("start -> last commit >= 2.5x Quix",
                 _verdict(table.get("service/quix", {}).get("records_per_s"), 2.5, True, "{:.2f}x")),
                ("after first commit >= 1.0x hand-written",
                 _verdict(table.get("service/handwritten", {}).get("after_first_commit_records_per_s"), 1.0, True,
                          "{:.2f}x")),
                ("first commit <= 5 s after start", _verdict(service.get("first_commit_s"), 5.0, False, "{:.1f} s")),
                ("peak RSS <= 1.5 GiB", _verdict(service.get("peak_rss_mb"), GIB_1_5, False, "{:,.0f} MB")),
            ]
        lines += [f"| {name} | {target} | {verdict} |" for target, verdict in rows]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    env = result["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    parts = [
        "# Benchmark results",
        "",
        f"{result['started_at']} on {env['machine'].get('cores')} cores ({env['machine'].get('cpu', '?')}, "
        f"{env['machine'].get('memory_gb')} GB). {versions}.",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in result["settings"].items()) + ".",
        "",
    ]
    for run in result["runs"]:
        parts += [run_markdown(run), ""]
    if len(result["runs"]) > 1 and result.get("mode") != "live":
        parts += [sweep_markdown(result), ""]
    if "service" in result["runs"][0]["systems"]:
        parts += [targets_markdown(result), ""]
    parts += [NOTES, ""]
    return "\n".join(parts)


def sweep_markdown(result: dict) -> str:
    """Per sweep value: each system's throughput and first commit, and the service's ratios to each peer."""
    names = list(result["runs"][0]["systems"])
    pairs = list(result["runs"][0].get("ratios", {}))
    lines = []
    for key, title in (("records_per_s", "records/s (start to last commit)"),
                       ("after_first_commit_records_per_s", "records/s after the first commit")):
        lines += [f"### Sweep: {title}", "",
                  f"| {result['sweep']} | " + " | ".join(names) + " | " + " | ".join(pairs) + " |",
                  "|---|" + "---:|" * (len(names) + len(pairs))]
        for run in result["runs"]:
            s, r = run["systems"], run.get("ratios", {})
            lines.append(f"| {_fmt(run['sweep_value'], '{:,}')} | ")
            lines[-1] += " | ".join(_fmt(s[n].get(key), "{:,.0f}") for n in names) + " | "
            lines[-1] += " | ".join(_fmt(r.get(pair, {}).get(key), "{:.2f}x") for pair in pairs) + " |"
        lines.append("")
    lines += ["### Sweep: time to first commit / last commit (s)", "",
              f"| {result['sweep']} | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for run in result["runs"]:
        s = run["systems"]
        lines.append(f"| {_fmt(run['sweep_value'], '{:,}')} | " + " | ".join(
            f"{_fmt(s[n].get('first_commit_s'), '{:.1f}')} / {_fmt(s[n].get('last_commit_s'), '{:.1f}')}"
            for n in names) + " |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    if result.get("mode") == "live":
        _plot_live(result, path, plt)
        return
    if len(runs) > 1:
        _plot_sweep(result, path, plt)
        return
    run = runs[0]
    systems = run["systems"]
    names = list(systems)
    labels = [systems[n]["label"].replace(" (", "\n(") for n in names]
    colors = COLORS[: len(names)]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    whole = [systems[n].get("records_per_s") or 0 for n in names]
    after = [systems[n].get("after_first_commit_records_per_s") or 0 for n in names]
    x = range(len(names))
    bars = ax.bar([i - 0.2 for i in x], whole, 0.4, color=colors, label="start to last commit")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in whole], fontsize=7)
    bars = ax.bar([i + 0.2 for i in x], after, 0.4, color=colors, alpha=0.45, hatch="//", label="after first commit")
    ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in after], fontsize=7)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("records/s")
    ax.set_title("Throughput")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    rss = [systems[n].get("peak_rss_mb") or 0 for n in names]
    ax.bar_label(ax.bar(labels, rss, color=colors), labels=[f"{v:,.0f}" for v in rss], fontsize=7)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("MB")
    ax.set_title("Peak RSS, whole process tree")
    ax = axes[1][0]
    for n, color in zip(names, colors, strict=True):
        points = systems[n].get("timeline") or []
        if points:
            ax.step([p[0] for p in points], [p[1] for p in points], where="post", color=color,
                    label=systems[n]["label"])
    ax.set_xlabel("seconds since process start")
    ax.set_ylabel("records committed")
    ax.set_title("Committed offsets over time")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    p50 = [systems[n].get("latency_p50_s") or 0 for n in names]
    p99 = [systems[n].get("latency_p99_s") or 0 for n in names]
    ax.bar([i - 0.2 for i in x], p50, 0.4, color=colors, label="p50")
    ax.bar([i + 0.2 for i in x], p99, 0.4, color=colors, alpha=0.45, hatch="//", label="p99")
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("Latency produce->upload (from system start for the backlog)")
    ax.legend(fontsize=8)
    w = run["workload"]
    fig.suptitle(f"{w['records']:,} records x {w['record_size']} B, {w['partitions']} partitions, "
                 f"{result['environment']['machine'].get('cores')} cores (shared machine: compare ratios)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLORS = ["#1f77b4", "#9467bd", "#ff7f0e", "#2ca02c", "#d62728"]


def _plot_live(result: dict, path: Path, plt) -> None:
    """Per rate: CPU per million (with the fetch threads' share), latency p50/p99, peak RSS."""
    runs = result["runs"]
    fig, axes = plt.subplots(len(runs), 3, figsize=(16, 4.8 * len(runs)), squeeze=False)
    for row, run in zip(axes, runs, strict=True):
        systems = run["systems"]
        names = list(systems)
        labels = [systems[n]["label"].replace(" (", "\n(") for n in names]
        colors = COLORS[: len(names)]
        x = list(range(len(names)))
        work = [systems[n].get("cpu_s_per_m_records_without_fetch") or 0 for n in names]
        fetch = [systems[n].get("fetch_cpu_s_per_m_records") or 0 for n in names]
        ax = row[0]
        ax.bar(x, work, color=colors, label="without fetch threads")
        bars = ax.bar(x, fetch, bottom=work, color=colors, alpha=0.35, hatch="//", label="librdkafka broker threads")
        ax.bar_label(bars, labels=[f"{w:.1f} + {f:.1f}" for w, f in zip(work, fetch, strict=True)], fontsize=7)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("CPU seconds per million records")
        ax.set_title(f"{run['rate']:,}/s: CPU per million records")
        ax.legend(fontsize=7)
        ax = row[1]
        p50 = [systems[n].get("latency_p50_s") or 0 for n in names]
        p99 = [systems[n].get("latency_p99_s") or 0 for n in names]
        ax.bar([i - 0.2 for i in x], p50, 0.4, color=colors, label="p50")
        bars = ax.bar([i + 0.2 for i in x], p99, 0.4, color=colors, alpha=0.45, hatch="//", label="p99")
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in p99], fontsize=7)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("seconds")
        ax.set_title(f"{run['rate']:,}/s: latency produce -> upload / file write")
        ax.legend(fontsize=7)
        ax = row[2]
        rss = [systems[n].get("peak_rss_mb") or 0 for n in names]
        ax.bar_label(ax.bar(x, rss, color=colors), labels=[f"{v:,.0f}" for v in rss], fontsize=7)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("MB")
        ax.set_title(f"{run['rate']:,}/s: peak RSS, whole process tree")
    fig.suptitle(f"Live mode, {runs[0]['seconds']:.0f} s per rate, {result['environment']['machine'].get('cores')} "
                 "cores (shared machine: compare ratios)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_sweep(result: dict, path: Path, plt) -> None:
    runs = result["runs"]
    names = list(runs[0]["systems"])
    values = [str(run["sweep_value"]) for run in runs]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for n in names:
        label = runs[0]["systems"][n]["label"]
        axes[0].plot(values, [run["systems"][n].get("records_per_s") or 0 for run in runs], marker="o", label=label)
        axes[1].plot(values, [run["systems"][n].get("peak_rss_mb") or 0 for run in runs], marker="o", label=label)
    axes[0].set_ylabel("records/s (start to last commit)")
    axes[1].set_ylabel("peak RSS (MB)")
    for ax in axes:
        ax.set_xlabel(result["sweep"])
        ax.legend(fontsize=8)
    fig.suptitle(f"Sweep over {result['sweep']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, directory: Path, stem: str = "results") -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{stem}.json", directory / f"{stem}.md", directory / f"{stem}.png"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths
