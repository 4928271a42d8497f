"""Summaries of a run: medians with min–max over the rounds, ratios to the physical limit and
to the best peer of equal durability, the speed targets (bench/README.md), JSON, a Markdown table
and a PNG plot of throughput against durability."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from . import instance_cases, service_report
from .catalog import CASES, Case

__all__ = ["summarise", "table", "write", "TARGETS"]

_BY_ID = {c.id: c for c in CASES}
_HEADLINE = "rec_per_s"


def _stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _metrics(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = sorted({k for s in samples for k in s})
    return {k: _stat([s[k] for s in samples if k in s]) for k in keys}


def _rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for key, samples in raw["samples"].items():
        cid, size_s = key.rsplit("@", 1)
        case: Case = _BY_ID[cid]
        m = _metrics(samples)
        base = {"id": cid, "size": int(size_s), "label": case.label, "group": case.group,
                "tier": case.tier, "mode": case.mode, "guarantee": case.guarantee,
                "limit": case.limit, "baseline": case.baseline, "runs": len(samples),
                "metrics": m}  # fmt: skip
        rows.append(base)
        if case.group != "peer":
            continue
        for prefix, mode, what in (("read", "read", "read by key/seq"),
                                    ("get", "consume", "get + ack/delete")):  # fmt: skip
            k = f"{prefix}_rec_per_s"
            if k in m:
                rows.append({**base, "id": f"{cid}:{prefix}", "label": f"{case.label}: {what}",
                             "mode": mode, "tier": "-" if mode == "read" else case.tier,
                             "metrics": {_HEADLINE: m[k]}})  # fmt: skip
    return rows


def _med(row: dict[str, Any] | None, metric: str = _HEADLINE) -> float | None:
    if row is None or metric not in row["metrics"]:
        return None
    return float(row["metrics"][metric]["median"])


def _find(rows: list[dict[str, Any]], cid: str, size: int) -> dict[str, Any] | None:
    for r in rows:
        if r["id"] == cid and r["size"] == size:
            return r
    return None


def _limit_row(rows: list[dict[str, Any]], cid: str, size: int) -> dict[str, Any] | None:
    got = _find(rows, cid, size)
    if got is None and size not in (100, 4096):  # blockdev's page-filling size: nearest
        got = _find(rows, cid, 4096)
    return got


def _best_peer(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    size = row["size"] if row["size"] in (100, 4096) else 4096
    mode = "single" if row["mode"] == "single" else row["mode"]
    best = None
    for r in rows:
        if r["group"] != "peer" or r["size"] != size or r["mode"] != mode:
            continue
        if mode != "read" and r["tier"] != row["tier"]:
            continue
        if best is None or (_med(r) or 0) > (_med(best) or 0):
            best = r
    return best


def _compare(row: dict[str, Any], other: dict[str, Any] | None, key: str, latency: bool) -> None:
    """``row`` against ``other``: the rate's ratio as ``row[key]``, or for a latency row the p50
    and p99 ratios as ``row[key + "_p50"]`` and ``_p99`` (higher: slower)."""
    if other is None:
        return
    if latency:
        for q in ("p50", "p99"):
            ratio = _ratio(_med(row, f"{q}_us"), _med(other, f"{q}_us"))
            if ratio is not None:
                row[f"{key}_{q}"] = ratio
    else:
        ratio = _ratio(_med(row), _med(other))
        if ratio is not None:
            row[key] = ratio


def _vs_baseline(row: dict[str, Any], base: dict[str, Any] | None) -> None:
    """A router row against the same measurement without routers (``x_baseline``)."""
    _compare(row, base, "x_baseline", row["mode"] == "latency")


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    rows = _rows(raw)
    for row in rows:
        if row["group"] != "tidelog":
            continue
        value = _med(row)
        lim = _limit_row(rows, row["limit"], row["size"]) if row["limit"] else None
        if value is not None and _med(lim):
            row["x_limit"] = value / _med(lim)  # type: ignore[operator]
            row["limit_label"] = lim["id"] if lim else None
        peer = _best_peer(rows, row)
        if value is not None and peer is not None and _med(peer):
            row["x_best_peer"] = value / _med(peer)  # type: ignore[operator]
            row["best_peer"] = peer["id"]
        if row.get("baseline"):
            _vs_baseline(row, _find(rows, row["baseline"], row["size"]))
    service_report.annotate(rows, _compare)
    order = {c.id: i for i, c in enumerate(CASES)}
    rows.sort(key=lambda r: (r["size"], order.get(r["id"].split(":")[0], 999), r["id"]))
    iso = _isolated(raw.get("isolated") or {}, rows)
    summary = {
        "settings": raw["settings"],
        "machine": raw["machine"],
        "versions": raw["versions"],
        "elapsed_s": raw["elapsed_s"],
        "unavailable": raw["unavailable"],
        "rows": rows,
        "isolated": iso,
    }
    summary["targets"] = _targets(rows, iso)
    summary["raw_samples"] = raw["samples"]
    summary["raw_isolated"] = raw.get("isolated") or {}
    return summary


def _isolated(iso: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seq = _find(rows, "seq_write", 1 << 20)
    mmap_row = _find(rows, "mmap_read", 100)
    read_mb = (
        float(mmap_row["metrics"]["mb_per_s_1mib_slices"]["median"])
        if mmap_row and "mb_per_s_1mib_slices" in mmap_row["metrics"]
        else None
    )
    for kind in ("clean", "tagged", "crash"):
        got = iso.get(kind)
        if not got:
            continue
        gb = got["build"]["payload_bytes"] / 1e9
        opens = [o["open_s"] for o in got["opens"]]
        s = _stat(opens)
        entry = {
            "payload_bytes": got["build"]["payload_bytes"],
            "disk_bytes": got["disk_bytes"],
            "open_s": s,
            "s_per_gb": {k: v / gb for k, v in s.items()},
            "peak_rss_mib": max(o["peak_rss_bytes"] for o in got["opens"]) / 2**20,
            "wal_since_checkpoint_bytes": got["build"].get("wal_since_checkpoint_bytes"),
            "replayed_batches": got["opens"][0].get("replayed_batches"),
            "build_rec_per_s": got["build"]["build_rec_per_s"],
        }
        if read_mb:
            # the time to read the whole store once from the page cache: the bound
            entry["read_all_s_at_mmap_bandwidth"] = got["disk_bytes"] / (read_mb * 1e6)
            entry["x_read_bound"] = entry["read_all_s_at_mmap_bandwidth"] / s["median"]
        out[kind] = entry
    for backend in ("file", "memory"):
        got = iso.get(f"rss_{backend}")
        if got:
            r = got[0]
            out[f"rss_{backend}"] = {
                "records": r["records"],
                "peak_rss_mib": r["peak_rss_bytes"] / 2**20,
                "rss_before_mib": r["rss_before_bytes"] / 2**20,
                "bytes_per_record": (r["peak_rss_bytes"] - r["rss_before_bytes"]) / r["records"],
            }
    if seq is not None:
        out["seq_write_mb_per_s"] = _med(seq, "mb_per_s")
    out["mmap_read_mb_per_s"] = read_mb
    return out


# --- the speed targets (bench/README.md; file backend, 100-byte records, one run's ratios) ----

TARGETS = [
    ("fsync_single", "durable single appends >= 0.9x raw overwrite-preallocated write+fdatasync"),
    ("fsync_many", "durable append_many(1000) >= 0.5x raw joined write + fdatasync"),
    ("fsync_many_steady", "the same, store in steady state (recycled WAL files, WAL-15)"),
    ("fsync_threads", "8 threads of fsync appends >= 4x the single-thread durable rate"),
    ("disk_single", "disk class single appends >= 1.0x queuelib FifoDiskQueue puts"),
    ("read", "read(after, limit=10000) >= 1M rec/s and >= lmdb point gets"),
    ("recovery_clean", "recovery of a 1 GB store after a clean close < 2 s"),
    ("recovery_crash", "recovery after a crash bounded by read bandwidth (<= 2x reading it)"),
    ("device_bytes", "device bytes per durable single append <= raw overwrite figure"),
    ("device_bytes_steady", "the same, store in steady state (recycled WAL files, WAL-15)"),
    ("blockdev_wa", "blockdev write amplification <= 1.05 for page-filling records"),
    *service_report.TARGETS,
    *instance_cases.TARGETS,
]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _targets(rows: list[dict[str, Any]], iso: dict[str, Any]) -> list[dict[str, Any]]:
    def med(cid: str, metric: str = _HEADLINE, size: int = 100) -> float | None:
        return _med(_find(rows, cid, size), metric)

    out: list[dict[str, Any]] = []

    def add(key: str, value: float | None, goal: float, detail: str, le: bool = False) -> None:
        text = dict(TARGETS)[key]
        met = None if value is None else (value <= goal if le else value >= goal)
        out.append({"id": key, "target": text, "value": value, "goal": goal, "met": met,
                    "detail": detail})  # fmt: skip

    fs = med("tl_file_fsync")
    add("fsync_single", _ratio(fs, med("raw_overwrite")), 0.9, "x raw_overwrite")
    joined, sealed = med("raw_joined"), med("raw_joined_sealed")

    def beside_sealed(cid: str) -> str:
        """The WAL + segments ceiling beside the ratio: what the design leaves of raw_joined."""
        if sealed is None or joined is None:
            return "x raw_joined"
        return (f"x raw_joined; the WAL + segments ceiling raw_joined_sealed is "
                f"{sealed / joined:.2f}x raw_joined, this case {_fmt(_ratio(med(cid), sealed))}x "
                "of it")  # fmt: skip

    add("fsync_many", _ratio(med("tl_file_fsync_many"), joined), 0.5,
        beside_sealed("tl_file_fsync_many"))  # fmt: skip
    add("fsync_many_steady", _ratio(med("tl_file_fsync_many_steady"), joined), 0.5,
        beside_sealed("tl_file_fsync_many_steady"))  # fmt: skip
    add("fsync_threads", _ratio(med("tl_file_fsync_t8"), fs), 4.0, "x tl_file_fsync")
    add("disk_single", _ratio(med("tl_file_disk"), med("queuelib_fifo")), 1.0, "x queuelib put")
    rd = med("tl_read_sealed")
    lm = med("lmdb_sync_1:read")
    read_ok = None if rd is None else min(rd / 1e6, _ratio(rd, lm) or rd / 1e6)
    add("read", read_ok, 1.0,
        f"{(rd or 0):,.0f} rec/s; x lmdb point get {(_ratio(rd, lm) or 0):.2f}")  # fmt: skip
    cleans = {k: iso[k]["s_per_gb"]["median"] for k in ("clean", "tagged") if iso.get(k)}
    add("recovery_clean", max(cleans.values()) if cleans else None, 2.0,
        "s per GB, the worse of: " + ", ".join(f"{k} {v:.2f}" for k, v in cleans.items()),
        le=True)  # fmt: skip
    crash = iso.get("crash")
    bound = (1 / crash["x_read_bound"]) if crash and crash.get("x_read_bound") else None
    add("recovery_crash", bound, 2.0,
        f"{crash['s_per_gb']['median']:.2f} s per GB; x time to read the store"
        if crash else "", le=True)  # fmt: skip
    tl_dev = med("tl_file_fsync", "dev_wbytes_per_rec")
    raw_dev = med("raw_overwrite", "dev_wbytes_per_rec")
    add(
        "device_bytes",
        _ratio(tl_dev, raw_dev),
        1.0,
        f"{(tl_dev or 0):,.0f} vs {(raw_dev or 0):,.0f} B/rec (/proc/diskstats)",
        le=True,
    )
    st_dev = med("tl_file_fsync_steady", "dev_wbytes_per_rec")
    add(
        "device_bytes_steady",
        _ratio(st_dev, raw_dev),
        1.0,
        f"{(st_dev or 0):,.0f} vs {(raw_dev or 0):,.0f} B/rec (/proc/diskstats)",
        le=True,
    )
    wa = None
    for r in rows:
        if r["id"] == "tl_blockdev_fsync_many" and r["size"] not in (100, 4096):
            wa = _med(r, "write_amplification")
    add("blockdev_wa", wa, 1.05, "device bytes / payload bytes (BDEV-19 counters)", le=True)
    return out + service_report.targets(rows) + instance_cases.targets(rows)


# --- output -------------------------------------------------------------------------------------


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def table(summary: dict[str, Any]) -> str:
    s = summary["settings"]
    m = summary["machine"]
    lines = [
        f"# tidelog bench ({'quick' if s['quick'] else 'full'}): median of {s['repeats']} runs "
        f"of {s['seconds']} s, min–max in brackets; {m.get('cpu', '?')}, {m['cpus']} cpus, "
        f"device {m['device']}, {summary['elapsed_s']:.0f} s",
        "",
        "dev B/rec: /proc/diskstats sectors written on the bench directory's device (all "
        "processes: noisy on a shared machine); proc B/rec: /proc/self/io write_bytes (this "
        "process, page-granular, no journal). fsync/rec: tidelog's own fdatasync counter.",
    ]
    for size in sorted({r["size"] for r in summary["rows"]}):
        lines += ["", f"## records of {size} bytes", "",
                  "| case | tier | rec/s [min–max] | MB/s | p50 µs | p99 µs | x limit | "
                  "x best peer (which) | dev B/rec | proc B/rec | fsync/rec |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in summary["rows"]:
            if r["size"] != size:
                continue
            mm = r["metrics"]
            head = mm.get(_HEADLINE) or mm.get("mb_per_s")
            unit = "" if _HEADLINE in mm else " MB/s"
            rate = (f"{_fmt(head['median'])}{unit} [{_fmt(head['min'])}–{_fmt(head['max'])}]"
                    if head else "-")  # fmt: skip

            def g(k: str, mm: dict[str, Any] = mm) -> str:
                return _fmt(mm[k]["median"]) if k in mm else "-"

            peer = (f"{_fmt(r['x_best_peer'])} ({r['best_peer']})" if "x_best_peer" in r
                    else "-")  # fmt: skip
            lim = f"{_fmt(r['x_limit'])} ({r['limit']})" if "x_limit" in r else "-"
            name = f"**{r['id']}**" if r["group"] == "tidelog" else r["id"]
            lines.append(
                f"| {name}: {r['label']} | {r['tier']} | {rate} | {g('mb_per_s')} | "
                f"{g('p50_us')} | {g('p99_us')} | {lim} | {peer} | {g('dev_wbytes_per_rec')} | "
                f"{g('proc_wbytes_per_rec')} | {g('fdatasync_per_rec')} |"
            )
    lines += _forwarding(summary["rows"])
    lines += _routers(summary["rows"])
    lines += service_report.section(summary["rows"])
    lines += instance_cases.section(summary["rows"])
    iso = summary["isolated"]
    if iso:
        lines += ["", "## recovery and memory (fresh processes)", ""]
        after = {
            "clean": "a clean close",
            "tagged": "a clean close, every record tagged",
            "crash": "SIGKILL",
        }
        for kind, what in after.items():
            e = iso.get(kind)
            if e:
                lines.append(
                    f"- recovery after {what}: "
                    f"{_fmt(e['open_s']['median'])} s [{_fmt(e['open_s']['min'])}–"
                    f"{_fmt(e['open_s']['max'])}] for {e['payload_bytes'] / 1e6:,.0f} MB of "
                    f"payload ({e['disk_bytes'] / 1e6:,.0f} MB on disk) = "
                    f"{_fmt(e['s_per_gb']['median'])} s/GB; reading the store at mmap bandwidth "
                    f"takes {_fmt(e.get('read_all_s_at_mmap_bandwidth'))} s; peak RSS "
                    f"{_fmt(e['peak_rss_mib'])} MiB; WAL beyond the last checkpoint "
                    f"{(e['wal_since_checkpoint_bytes'] or 0) / 1e6:,.1f} MB"
                )
        for backend in ("file", "memory"):
            e = iso.get(f"rss_{backend}")
            if e:
                lines.append(
                    f"- peak RSS, {backend}:// appending {e['records']:,} records of 100 B: "
                    f"{_fmt(e['peak_rss_mib'])} MiB ({_fmt(e['rss_before_mib'])} MiB before; "
                    f"{_fmt(e['bytes_per_record'])} B per record held)"
                )
    lines += ["", "## speed targets (100-byte records, ratios from this run)", "",
              "| target | value | goal | met |", "|---|---|---|---|"]  # fmt: skip
    for t in summary["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['value'])} ({t['detail']}) | {t['goal']} | "
                     f"{met} |")  # fmt: skip
    if summary["unavailable"]:
        lines += ["", "## not measured", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(summary["unavailable"].items())]
    return "\n".join(lines)


def _forwarding(rows: list[dict[str, Any]]) -> list[str]:
    """tidelog's forwarder against the real client (the x best peer of each forwarding row),
    with the record sizes the receiver stored for each."""

    def stored(r: dict[str, Any]) -> str:
        m = r["metrics"]
        if "stored_b_median" not in m:
            return "?"
        lo, hi = m["stored_b_min"]["min"], m["stored_b_max"]["max"]
        return f"{_fmt(m['stored_b_median']['median'])} B [{_fmt(lo)}–{_fmt(hi)}]"

    out: list[str] = []
    for r in rows:
        if r["mode"] != "forward" or r["group"] != "tidelog":
            continue
        peer = _find(rows, r.get("best_peer", ""), r["size"])
        if not out:
            out = ["", "## forwarding into tidelog serve (records stored: median [min–max])", ""]
        if peer is None:
            out.append(f"- {r['id']} @ {r['size']}: {_fmt(_med(r))} rec/s, stored "
                       f"{stored(r)}; no client row to compare with")  # fmt: skip
            continue
        out.append(
            f"- {r['id']} @ {r['size']}: {_fmt(_med(r))} rec/s (stored {stored(r)}) vs "
            f"{peer['id']} {_fmt(_med(peer))} rec/s (stored {stored(peer)}): "
            f"**{_fmt(r['x_best_peer'])}x**"
        )
    return out


def _routers(rows: list[dict[str, Any]]) -> list[str]:
    """Each router row beside its baseline (the same appends without routers): the rate
    ratio and the WAL's work per source append, or append -> readable latency p50/p99."""

    def per_append(r: dict[str, Any]) -> str:
        return " / ".join(_fmt(_med(r, k)) for k in _WAL_KEYS)

    out: list[str] = []
    for r in rows:
        if not r.get("baseline"):
            continue
        if not out:
            out = ["", "## routers (file://; each beside its baseline, the same appends without "
                   "routers)", ""]  # fmt: skip
        base = _find(rows, r["baseline"], r["size"])
        head = f"- {r['id']} @ {r['size']}: "
        if base is None:
            out.append(f"{head}{_fmt(_med(r))} rec/s; no {r['baseline']} row to compare with")
        elif r["mode"] == "latency":
            out.append(
                f"{head}append -> copy readable in dest p50 {_fmt(_med(r, 'p50_us'))} µs, p99 "
                f"{_fmt(_med(r, 'p99_us'))} µs vs {base['id']} (readable in the source) p50 "
                f"{_fmt(_med(base, 'p50_us'))} µs, p99 {_fmt(_med(base, 'p99_us'))} µs: "
                f"**{_fmt(r.get('x_baseline_p50'))}x / {_fmt(r.get('x_baseline_p99'))}x**"
            )
        else:
            out.append(
                f"{head}{_fmt(_med(r))} rec/s vs {base['id']} {_fmt(_med(base))} rec/s: "
                f"**{_fmt(r.get('x_baseline'))}x**; per source append, WAL writes / bytes / "
                f"fdatasyncs {per_append(r)} vs {per_append(base)}"
            )
    return out


_WAL_KEYS = ("wal_writes_per_rec", "wal_bytes_per_rec", "fdatasync_per_rec")


def plot(summary: dict[str, Any], path: str) -> bool:
    """Throughput (log scale) against durability tier, tidelog beside the peers; one panel
    per record size. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = [s for s in (100, 4096) if any(r["size"] == s for r in summary["rows"])]
    if not sizes:
        return False
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 6), squeeze=False)
    tiers = ["durable", "buffered"]
    for ax, size in zip(axes[0], sizes):
        for r in summary["rows"]:
            if r["size"] != size or r["tier"] not in tiers or r["mode"] not in ("single", "batch"):
                continue
            y = _med(r)
            if not y:
                continue
            x = tiers.index(r["tier"]) + (0.15 if r["mode"] == "batch" else -0.15)
            colour = {"tidelog": "tab:blue", "peer": "tab:orange", "limit": "tab:grey"}[r["group"]]
            ax.scatter([x], [y], color=colour, marker="o" if r["mode"] == "single" else "s")
            ax.annotate(r["id"], (x, y), fontsize=7, xytext=(4, 2), textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xticks([-0.15, 0.15, 0.85, 1.15])
        ax.set_xticklabels(["durable\nsingle", "durable\nbatch", "buffered\nsingle",
                            "buffered\nbatch"])  # fmt: skip
        ax.set_ylabel("records/s (median)")
        ax.set_title(f"{size}-byte records: blue tidelog, orange peers, grey physical limits")
        ax.grid(True, which="both", axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(summary: dict[str, Any], out: str, plot_png: bool = True) -> list[str]:
    paths = []
    p = os.path.join(out, "results.json")
    with open(p, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
    paths.append(p)
    p = os.path.join(out, "table.md")
    with open(p, "w", encoding="utf-8") as f:
        f.write(table(summary) + "\n")
    paths.append(p)
    if plot_png:
        p = os.path.join(out, "throughput_vs_durability.png")
        if plot(summary, p):
            paths.append(p)
    return paths
