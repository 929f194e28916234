#!/usr/bin/env python3
"""Prints Skyriver's fetch over rxe next to perftest, with ratios, and writes JSON.

    bench-table.py DIR      DIR holds perftest.tsv and bench-fetch*.json (guest/bench.sh)

Writes DIR/bench-softroce.json. Informational: the targets are reported, never asserted.
MB/s are 10^6 bytes per second on both sides (perftest's 2^20 MB converted by guest/bench.sh).
"""
import json
import sys
from pathlib import Path

READ_TARGET = 0.9  # fetch >= 0.9x ib_read_bw at >= 1 MiB
LAT_TARGET = 2.0  # 4 KiB fetch p50 <= 2x an ib_send_lat round trip


def size_name(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(x, spec):
    return format(x, spec) if x is not None else "-"


def ratio_text(x):
    return f"{x:7.2f}x" if x is not None else f"{'-':>8}"


def main():
    out = Path(sys.argv[1])
    perftest = {}
    tsv = out / "perftest.tsv"
    if tsv.exists():
        for line in tsv.read_text().splitlines():
            tool, size, value = line.split("\t")
            perftest[(tool, int(size))] = float(value)
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("bench-fetch*.json"))]
    if not runs:
        sys.exit(f"no bench-fetch*.json in {out}")
    fetch = runs[0]
    rows = [r for run in runs for r in run["results"]]
    order = {"eager": 0, "rendezvous": 1, "auto": 2}
    rows.sort(key=lambda r: (order.get(r["mode"], 3), r["mode"]))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    sizes = sorted({r["size_bytes"] for r in rows})
    by = {(r["mode"], r["size_bytes"]): r for r in rows}

    print("Skyriver fetch vs perftest on rxe0 -> rxe1 (same boot; MB/s = 10^6 B/s)")
    print(f"{'size':>8} {'ib_read_bw':>10} {'ib_send_bw':>10} | {'mode':>10} {'fetch MB/s':>10}"
          f" {'p50 us':>9} {'p99 us':>9} {'vs read':>8} {'vs send':>8}")
    table = []
    for size in sizes:
        read_bw = perftest.get(("ib_read_bw", size))
        send_bw = perftest.get(("ib_send_bw", size))
        for i, mode in enumerate(modes):
            r = by.get((mode, size))
            if r is None:
                continue
            vs_read, vs_send = ratio(r["mb_per_sec"], read_bw), ratio(r["mb_per_sec"], send_bw)
            lead = (f"{size_name(size):>8} {fmt(read_bw, '10.1f')} {fmt(send_bw, '10.1f')}" if i == 0
                    else f"{'':>8} {'':>10} {'':>10}")
            print(f"{lead} | {mode:>10} {r['mb_per_sec']:10.1f} {r['p50_us']:9.1f} {r['p99_us']:9.1f}"
                  f" {ratio_text(vs_read)} {ratio_text(vs_send)}")
            table.append({"size_bytes": size, "mode": mode, "fetch_mb_per_sec": r["mb_per_sec"],
                          "fetch_p50_us": r["p50_us"], "fetch_p99_us": r["p99_us"],
                          "ib_read_bw_mb_per_sec": read_bw, "ib_send_bw_mb_per_sec": send_bw,
                          "ratio_to_ib_read_bw": vs_read, "ratio_to_ib_send_bw": vs_send})

    targets = []
    mode = "auto" if "auto" in modes else modes[0]
    for size in sizes:
        if size < 1 << 20:
            continue
        r = by.get((mode, size))
        vs = ratio(r and r["mb_per_sec"], perftest.get(("ib_read_bw", size)))
        targets.append({"target": f"{mode} fetch >= {READ_TARGET}x ib_read_bw at {size_name(size)}",
                        "value": vs, "met": vs is not None and vs >= READ_TARGET})
    # The better (lower) of perftest's polling and event-driven latencies is the reference.
    lat = {m: perftest.get((f"ib_send_lat_{m}", 4096)) for m in ("poll", "event")}
    lat = {m: v for m, v in lat.items() if v}
    r = by.get((mode, 4096))
    if r is not None and lat:
        best = min(lat, key=lat.get)
        rtt = 2 * lat[best]
        vs = r["p50_us"] / rtt
        shown = ", ".join(f"{m} {v:.1f} us" for m, v in lat.items())
        print(f"latency 4 KiB: {mode} fetch p50 {r['p50_us']:.1f} us; ib_send_lat round trip "
              f"{rtt:.1f} us (2 x the better one-way t_typical: {shown}): {vs:.2f}x")
        targets.append({"target": f"{mode} 4 KiB fetch p50 <= {LAT_TARGET}x ib_send_lat round trip",
                        "value": vs, "met": vs <= LAT_TARGET})
    auto_rows = [row for run in runs for row in run.get("auto_vs_forced", [])]
    if auto_rows:
        threshold = fetch.get("auto_threshold_bytes")
        print()
        print("auto against forced modes, interleaved in one cluster (p50 us)"
              + (f"; auto threshold {threshold} B" if threshold is not None else ""))
        print(f"{'size':>8} {'eager':>10} {'rendezvous':>11} {'auto':>10} {'auto/best':>10}"
              "   auto's repeats (p50 range)")
        # Rows exist only where both paths do (up to the eager capacity); each mode's p50 and
        # the range of its repeats' p50s.
        for row in auto_rows:
            spread = row["auto"].get("p50_repeats_us") or {}
            shown = (f"   {spread['min']:.1f}-{spread['max']:.1f}"
                     if "min" in spread and "max" in spread else "")
            print(f"{size_name(row['size_bytes']):>8} {row['eager']['p50_us']:10.1f}"
                  f" {row['rendezvous']['p50_us']:11.1f} {row['auto']['p50_us']:10.1f}"
                  f" {row['auto_over_best']:10.2f}{shown}")
            targets.append({"target": f"auto p50 within 10% of the better forced mode at "
                                      f"{size_name(row['size_bytes'])}",
                            "value": row["auto_over_best"], "met": row["within_10_percent"]})
        print()
    for t in targets:
        print(f"target {'met   ' if t['met'] else 'MISSED'} {t['target']}: {ratio_text(t['value']).strip()}")

    result = {"benchmark": "fetch-vs-perftest", "fabric": "verbs", "devices": "rxe0,rxe1",
              "perftest": [{"tool": k[0], "size_bytes": k[1], "value": v} for k, v in sorted(perftest.items())],
              "rows": table, "targets": targets, "machine": fetch.get("machine")}
    (out / "bench-softroce.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out / 'bench-softroce.json'}")


if __name__ == "__main__":
    main()
