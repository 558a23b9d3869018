#!/usr/bin/env python3
"""Draws hostir timelines (hir_timeline_write's Chrome-trace JSON) as one SVG:
a panel per trace, on one time scale, a row per rank and stream; the GPU's
own spans where the trace has them, else the host's.

    tools/timeline_svg.py out.svg "serial=a.json" "pipelined=b.json" ...

Plain Python 3, no packages."""
import json
import sys

COLOURS = [  # (name prefix, fill, legend)
    ("MatmulOp", "#4878d0", "GEMM"),
    ("Communication", "#ee854a", "collective"),
    ("EndCoalescing", "#ee854a", None),
    ("P2PCommunication", "#ee854a", "send/recv"),
    ("LoadStoreOp", "#6acc64", "copy / add / sum"),
    ("BinaryOp", "#6acc64", None),
    ("ReductionOp", "#6acc64", None),
    ("PostOnStream", "#6acc64", None),
    ("Wait", "#c8c8c8", "stream waits"),
    ("Synchronize", "#c8c8c8", None),
]
ROW, GAP, LEFT, WIDTH, TITLE = 16, 3, 190, 900, 22


def colour(name):
    for prefix, fill, _ in COLOURS:
        if name.startswith(prefix):
            return fill
    return "#999999"


def load(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    cat = "gpu" if any(e["cat"] == "gpu" for e in spans) else "host_ir"
    spans = [e for e in spans if e["cat"] == cat]
    if not spans:
        raise ValueError("no spans: record them with hir_evaluator_record_timeline before the runs")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    t0 = min(e["ts"] for e in spans)
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    return {"spans": spans, "rows": rows, "names": names, "procs": procs, "t0": t0, "cat": cat,
            "end": max(e["ts"] + e["dur"] for e in spans) - t0}


def usage(why):
    sys.exit("timeline_svg: %s\nusage: %s" % (why, __doc__.split("\n\n")[1].strip()))


def main(argv):
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        usage("give the SVG to write, then one or more LABEL=TRACE.json")
    panels = []
    for a in argv[2:]:
        label, path = a.split("=", 1)
        try:
            panels.append((label, load(path)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            usage("%s is not a trace written by hir_timeline_write (%s: %s)" % (path, type(e).__name__, e))
    span_us = max(p["end"] for _, p in panels)
    scale = WIDTH / span_us
    out, y = [], 0
    for label, p in panels:
        out.append('<text x="4" y="%d" font-weight="bold">%s: %.3f ms (%s spans)</text>' %
                   (y + 15, label, p["end"] / 1e3, "GPU" if p["cat"] == "gpu" else "host"))
        y += TITLE
        for pid, tid in p["rows"]:
            track = p["names"].get((pid, tid), "tid %d" % tid).replace(" (GPU)", "").replace(" (host)", "")
            out.append('<text x="4" y="%d" font-size="11">%s, %s</text>' %
                       (y + ROW - 4, p["procs"].get(pid, "rank %d" % pid).split(" (")[0], track))
            for e in p["spans"]:
                if (e["pid"], e["tid"]) != (pid, tid):
                    continue
                x, w = LEFT + (e["ts"] - p["t0"]) * scale, max(e["dur"] * scale, 0.5)
                out.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s %.1f us</title></rect>' %
                           (x, y, w, ROW - 2, colour(e["name"]), e["name"], e["dur"]))
            y += ROW
        y += GAP * 4
    step = 10 ** len(str(int(span_us / 8))) / 10 if span_us >= 8 else 1  # about 8 ticks, at a round number of us
    while span_us / step > 10:
        step *= 2
    t = 0
    while t <= span_us:
        x = LEFT + t * scale
        out.append('<line x1="%.1f" y1="0" x2="%.1f" y2="%d" stroke="#00000022"/>' % (x, x, y))
        out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%g ms</text>' % (x, y + 12, t / 1e3))
        t += step
    y += 20
    x = LEFT
    for _, fill, legend in COLOURS:
        if legend:
            out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d" font-size="11">%s</text>' %
                       (x, y, fill, x + 16, y + 10, legend))
            x += 30 + 7 * len(legend)
    y += 20
    with open(argv[1], "w") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">\n'
                '<rect width="100%%" height="100%%" fill="white"/>\n%s\n</svg>\n' % (LEFT + WIDTH + 20, y, "\n".join(out)))


if __name__ == "__main__":
    main(sys.argv)
