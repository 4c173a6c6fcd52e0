#!/usr/bin/env python3
"""When does EP overlap pay? A sweep of `epo bench --compare` over the link model's
communication/compute ratio and the number of micro-batches per step.

    scripts/sweep_overlap.py OUT_DIR [--ratios 0,0.5,1,2] [--micro_batches 2,4,8]
                             [--repeats 1] [--max_steps 3] [--epo build/release/bin/epo]
                             [-- extra epo bench arguments]

Each point is one `epo bench --compare` run directory under OUT_DIR (ratio 0 = link model off);
a point whose metrics.json exists is not run again, so an interrupted sweep resumes. At the end
it reads every metrics.json and writes OUT_DIR/sweep.csv, OUT_DIR/sweep.md (the table) and
OUT_DIR/overlap-sweep.svg (speedup of each overlap schedule over the baseline against the ratio,
one line per micro-batch count). Only the Python standard library is used.
"""
import argparse
import csv
import json
import os
import subprocess
import sys


def run_point(args, out, ratio, mbs, extra):
    run_dir = os.path.join(out, f"ratio-{ratio:g}-mbs-{mbs}")
    if os.path.exists(os.path.join(run_dir, "metrics.json")):
        return run_dir
    # The embedded proxy has 2 ranks, expert parallel 2, data parallel 2, micro-batch size 1:
    # global batch = 2 x micro-batches.
    cmd = [args.epo, "bench", "--compare", "--repeats", str(args.repeats), "--max_steps",
           str(args.max_steps), "-gb", str(2 * mbs), "--comm_compute_ratio", f"{ratio:g}",
           "--out", run_dir] + extra
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return run_dir


def load(run_dir, ratio, mbs):
    with open(os.path.join(run_dir, "metrics.json")) as f:
        m = json.load(f)
    runs = {r["name"]: r for r in m["runs"]}
    base = runs["baseline"]
    row = {
        "ratio": ratio,
        "micro_batches": mbs,
        "achieved_ratio": (m["calibration"] or {}).get("achieved_ratio"),
        "inter_node_gbps": m["link"]["inter_node_gbps"],
        "baseline_s": base["step_time_s"]["median"],
        "baseline_exposed_s": base["exposed_comm_s"],
        "bitwise_identical": m["loss_bitwise_identical"],
    }
    for name, key in (("overlap", "overlap"), ("overlap+delay_wgrad", "delayed")):
        r = runs[name]
        row[f"{key}_s"] = r["step_time_s"]["median"]
        row[f"{key}_speedup"] = base["step_time_s"]["median"] / r["step_time_s"]["median"]
        row[f"{key}_efficiency"] = r.get("overlap_efficiency")
        row[f"{key}_exposed_s"] = r["exposed_comm_s"]
    return row


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def write_table(rows, path):
    with open(path, "w") as f:
        f.write("| comm/compute | micro-batches | achieved | baseline s | overlap s | speedup | "
                "efficiency | +delay_wgrad s | speedup | efficiency | bit-identical |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {'off' if r['ratio'] == 0 else fmt(r['ratio'], 'g')} "
                    f"| {r['micro_batches']} | {fmt(r['achieved_ratio'], '.2f')} "
                    f"| {r['baseline_s']:.2f} | {r['overlap_s']:.2f} "
                    f"| {r['overlap_speedup']:.2f}x | {fmt(r['overlap_efficiency'], '.2f')} "
                    f"| {r['delayed_s']:.2f} | {r['delayed_speedup']:.2f}x "
                    f"| {fmt(r['delayed_efficiency'], '.2f')} "
                    f"| {'yes' if r['bitwise_identical'] else 'NO'} |\n")


def write_svg(rows, path):
    """Speedup against the comm/compute ratio: one solid line (overlap) and one dashed line
    (overlap + delayed wgrad) per micro-batch count; ratio 0 (link model off) at the left."""
    ratios = sorted({r["ratio"] for r in rows})
    mbs_list = sorted({r["micro_batches"] for r in rows})
    w, h, left, right, top, bottom = 700, 400, 60, 190, 30, 50
    xs = {x: left + i * (w - left - right) / max(1, len(ratios) - 1) for i, x in enumerate(ratios)}
    speeds = [r[k] for r in rows for k in ("overlap_speedup", "delayed_speedup")]
    lo, hi = min(0.8, min(speeds)), max(1.2, max(speeds)) * 1.05

    def y(v):
        return top + (hi - v) / (hi - lo) * (h - top - bottom)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2 - 40}" y="18" font-size="14">When does EP overlap pay?</text>']
    # Axes, grid, labels.
    tick = lo - (lo % 0.1)
    while tick <= hi:
        if tick >= lo:
            out.append(f'<line x1="{left}" x2="{w - right}" y1="{y(tick):.1f}" '
                       f'y2="{y(tick):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">'
                       f'{tick:.1f}</text>')
        tick += 0.1
    out.append(f'<line x1="{left}" x2="{w - right}" y1="{y(1):.1f}" y2="{y(1):.1f}" '
               f'stroke="black" stroke-dasharray="2,2"/>')
    for x, px in xs.items():
        out.append(f'<text x="{px:.1f}" y="{h - bottom + 18}" text-anchor="middle">'
                   f'{"off" if x == 0 else format(x, "g")}</text>')
    out.append(f'<text x="{(left + w - right) / 2:.1f}" y="{h - 12}" text-anchor="middle">'
               f'baseline communication / compute (link model)</text>')
    out.append(f'<text x="16" y="{(top + h - bottom) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + h - bottom) / 2:.1f})">'
               f'speedup over baseline (step time)</text>')
    for i, mbs in enumerate(mbs_list):
        color = colors[i % len(colors)]
        pts = sorted((r for r in rows if r["micro_batches"] == mbs), key=lambda r: r["ratio"])
        for key, dash in (("overlap_speedup", ""), ("delayed_speedup", ' stroke-dasharray="6,3"')):
            line = " ".join(f"{xs[r['ratio']]:.1f},{y(r[key]):.1f}" for r in pts)
            out.append(f'<polyline points="{line}" fill="none" stroke="{color}" '
                       f'stroke-width="2"{dash}/>')
            for r in pts:
                out.append(f'<circle cx="{xs[r["ratio"]]:.1f}" cy="{y(r[key]):.1f}" r="3" '
                           f'fill="{color}"/>')
        ly = top + 20 + i * 20
        out.append(f'<line x1="{w - right + 12}" x2="{w - right + 36}" y1="{ly}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 42}" y="{ly + 4}">{mbs} micro-batches</text>')
    ly = top + 20 + len(mbs_list) * 20 + 10
    out.append(f'<text x="{w - right + 12}" y="{ly}">solid: overlap</text>')
    out.append(f'<text x="{w - right + 12}" y="{ly + 16}">dashed: + delay_wgrad</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--ratios", default="0,0.5,1,2")
    p.add_argument("--micro_batches", default="2,4,8")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=3)
    p.add_argument("--epo", default="build/release/bin/epo")
    args = p.parse_args(argv)
    try:
        ratios = [float(v) for v in args.ratios.split(",")]
        mbs_list = [int(v) for v in args.micro_batches.split(",")]
    except ValueError as e:
        p.error(f"--ratios / --micro_batches: comma-separated numbers ({e})")
    if any(r < 0 for r in ratios) or any(m < 1 for m in mbs_list):
        p.error("--ratios must be >= 0 (0 = link model off), --micro_batches >= 1")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for mbs in mbs_list:
        for ratio in ratios:
            rows.append(load(run_point(args, args.out, ratio, mbs, extra), ratio, mbs))
    rows.sort(key=lambda r: (r["micro_batches"], r["ratio"]))
    with open(os.path.join(args.out, "sweep.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        wr.writeheader()
        wr.writerows(rows)
    write_table(rows, os.path.join(args.out, "sweep.md"))
    write_svg(rows, os.path.join(args.out, "overlap-sweep.svg"))
    with open(os.path.join(args.out, "sweep.md")) as f:
        print(f.read())
    print(f"wrote {args.out}/sweep.csv, sweep.md, overlap-sweep.svg")


if __name__ == "__main__":
    main()
