#!/usr/bin/env python3
"""Merges one `scripts/bench-all` folder into summary.md: every hetmem link cell beside the best
peer cell of the same name and size (highest GB/s, lowest microseconds), each bandwidth also as a
share of the copy-engine ceiling hetmem measured in the same run; then the compare and pipeline
tables as hetmem wrote them.

    python3 scripts/bench-summary.py OUT_DIR > OUT_DIR/summary.md
"""

import json
import pathlib
import sys


def fmt_size(n):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def ceiling_for(link, path_direction):
    ceiling = link.get("ceiling")
    if not ceiling:
        return None
    return {"h2d": ceiling["h2d_gb_s"], "d2h": ceiling["d2h_gb_s"],
            "both": min(ceiling["h2d_gb_s"], ceiling["d2h_gb_s"])}.get(path_direction)


def direction_of(name):
    if name.endswith("_both") or name == "zero_copy_read_write":
        return "both"
    if name.endswith("_d2h") or name == "zero_copy_write":
        return "d2h"
    return "host" if name.startswith("host_") else "h2d"


def main():
    out = pathlib.Path(sys.argv[1])
    link = json.loads((out / "link.json").read_text())
    peers = {}
    for file in sorted(out.glob("*-link.json")):
        report = json.loads(file.read_text())
        peers[report.get("peer", file.stem)] = report
    lines = [f"# hetmem bench: {link['device']}", ""]
    for name in ("COMMIT", "machine.txt"):
        if (out / name).exists():
            lines.append(f"- {name}: {(out / name).read_text().strip().replace(chr(10), '; ')}")
    lines.append(f"- peers: {', '.join(peers) or 'none ran'}")
    for failed in sorted(out.glob("*-failed.txt")):
        tail = failed.read_text().strip().splitlines()[-1:] or ["(no message)"]
        lines.append(f"- {failed.stem.removesuffix('-failed')} did not run: {tail[0]}")
    if link.get("ceiling"):
        c = link["ceiling"]
        lines.append(f"- copy-engine ceiling in this run: H2D {c['h2d_gb_s']:.2f} GB/s, D2H {c['d2h_gb_s']:.2f} GB/s")
    lines += ["", "## Bandwidth, GB/s median (share of the ceiling)", "",
              "| path | size | hetmem | best peer | peer | hetmem / peer |", "|---|---:|---:|---:|---|---:|"]

    def share(value, name):
        top = ceiling_for(link, direction_of(name))
        return f"{value:.2f} ({value / top:.0%})" if top else f"{value:.2f}"

    for cell in link["bandwidth"]:
        name, size, mine = cell["path"], cell["bytes"], cell["gb_s"]["median"]
        best = None
        for peer, report in peers.items():
            for other in report.get("bandwidth", []):
                if other["path"] == name and other["bytes"] == size:
                    if best is None or other["gb_s"]["median"] > best[1]:
                        best = (peer, other["gb_s"]["median"])
        peer_cell = share(best[1], name) if best else "-"
        ratio = f"{mine / best[1]:.2f}x" if best else "-"
        lines.append(f"| {name} | {fmt_size(size)} | {share(mine, name)} | {peer_cell} | "
                     f"{best[0] if best else '-'} | {ratio} |")
    lines += ["", "## Latency, microseconds median (p99)", "",
              "| path | size | hetmem | best peer | peer | peer / hetmem |", "|---|---:|---:|---:|---|---:|"]
    for cell in link["latency"]:
        name, size, us = cell["path"], cell["bytes"], cell.get("us")
        mine = f"{us['median']:.2f} ({us['p99']:.2f})" if us else "not measured"
        best = None
        for peer, report in peers.items():
            for other in report.get("latency", []):
                if other["path"] == name and other["bytes"] == size:
                    if best is None or other["us"]["median"] < best[1]["median"]:
                        best = (peer, other["us"])
        peer_cell = f"{best[1]['median']:.2f} ({best[1]['p99']:.2f})" if best else "-"
        ratio = f"{best[1]['median'] / us['median']:.2f}x" if best and us else "-"
        lines.append(f"| {name} | {fmt_size(size)} | {mine} | {peer_cell} | {best[0] if best else '-'} | {ratio} |")
    lines.append("")
    for name in ("link.md", "compare.md", "pipeline.md"):
        if (out / name).exists():
            lines += [(out / name).read_text().strip(), ""]
    svgs = sorted((out / "svg").glob("*.svg")) if (out / "svg").exists() else []
    if svgs:
        lines += ["## Plots", ""] + [f"![{svg.stem}](svg/{svg.name})" for svg in svgs] + [""]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
