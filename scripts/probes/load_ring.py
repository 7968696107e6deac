"""Where `hetmem load`'s warm rate goes with the staging ring's shape, and what the windows route
adds beside it: runs the CLI (`--raw --json`, the shards of a checkpoint python_load.py --make
wrote, read once first so the page cache holds them) over

  ring      staged, threads x chunk x depth (the ring is depth x chunk of pinned memory);
  windows   the registered-window route alone, threads x chunk;
  together  two processes at once, one staged and one by windows, each on half the shards
            (listed several times, so the two overlap for most of their run), against each
            alone on the same half.

Each cell runs --reps times; the CLI's own rate (the stream's seconds, without the ring's
pinning) is reported, median and range. `--ring 8x8x16,8x4x16` names the ring cells; `--ab NAME`
runs each ring cell with the environment variable NAME set and unset, rep by rep in turn (an A/B
of a knob a test build reads), and `--only-ring` leaves out the windows and together parts.
Usage:

    load_ring.py --cli gpu-bundle/bin/hetmem --dir /tmp/ck8 [--json out.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MIB = 1 << 20


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 * MIB):
            pass


def load(cli, files, method, threads, chunk_mib, depth):
    command = [cli, "load", *files, "--raw", "--json", "--link-rate", "55", "--method", method,
               "--threads", str(threads), "--chunk", f"{chunk_mib}MiB"]
    if depth is not None:
        command += ["--depth", str(depth)]
    return command


def run(command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:2])} ... failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)


def summary(rates):
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "reps": rates}


def cell(command, reps):
    return summary([run(command)["gb_per_s"] for _ in range(reps)])


def ab_cell(command, reps, name):
    """`command` with `name` set and unset in turn: {"set": ..., "unset": ...}."""
    with_it = dict(os.environ, **{name: "1"})
    without = {k: v for k, v in os.environ.items() if k != name}
    rates = {"set": [], "unset": []}
    for _ in range(reps):
        rates["set"].append(run(command, with_it)["gb_per_s"])
        rates["unset"].append(run(command, without)["gb_per_s"])
    return {key: summary(value) for key, value in rates.items()}


def show(label, result):
    print(f"{label}: {result['median']:.1f} GB/s ({result['min']:.1f}-{result['max']:.1f})", flush=True)


def together(cli, halves, repeat, reps):
    """Staged on one half and windows on the other, at once and each alone."""
    staged = load(cli, halves[0] * repeat, "staged", 8, 8, 16)
    windows = load(cli, halves[1] * repeat, "windows", 4, 64, 8)
    out = {"staged_alone": cell(staged, reps), "windows_alone": cell(windows, reps), "at_once": []}
    show("  staged alone (8 x 8 MiB x 16)", out["staged_alone"])
    show("  windows alone (4 x 64 MiB x 8)", out["windows_alone"])
    for _ in range(reps):
        start = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in (staged, windows)]
        reports = [json.loads(p.communicate()[0]) for p in procs]
        wall = time.perf_counter() - start
        total = sum(r["bytes"] for r in reports)
        both = {"staged": reports[0]["gb_per_s"], "windows": reports[1]["gb_per_s"],
                "sum_of_rates": reports[0]["gb_per_s"] + reports[1]["gb_per_s"],
                "bytes_over_process_wall": total / wall / 1e9,
                "seconds": [reports[0]["seconds"], reports[1]["seconds"]]}
        out["at_once"].append(both)
        print(f"  at once: staged {both['staged']:.1f} + windows {both['windows']:.1f} = "
              f"{both['sum_of_rates']:.1f} GB/s (stream seconds {both['seconds'][0]:.3f} / "
              f"{both['seconds'][1]:.3f}; bytes over the processes' wall {both['bytes_over_process_wall']:.1f})",
              flush=True)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="times each half is listed, together")
    parser.add_argument("--ring", help="ring cells, THREADSxCHUNK_MIBxDEPTH,...")
    parser.add_argument("--ab", metavar="NAME", help="A/B each ring cell on this variable")
    parser.add_argument("--only-ring", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    files = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir) if f.endswith(".safetensors"))
    for path in files:
        warm(path)
    results = {"files": files, "bytes": sum(os.path.getsize(f) for f in files)}

    print("ring: staged, threads x chunk x depth", flush=True)
    if args.ring:
        ring = [tuple(int(n) for n in c.split("x")) for c in args.ring.split(",")]
    else:
        ring = [(8, 8, d) for d in (4, 8, 10, 12, 16, 24, 32, 64)]
        ring += [(8, 16, d) for d in (8, 10, 16)] + [(8, 4, d) for d in (8, 16, 32)] + [(8, 2, d) for d in (16, 64)]
        ring += [(t, c, d) for t in (12, 16) for c in (8, 16) for d in (t, t + 2, 2 * t)]
    results["ring"] = {}
    for threads, chunk, depth in ring:
        label = f"{threads}x{chunk}MiBx{depth}"
        command = load(args.cli, files, "staged", threads, chunk, depth)
        if args.ab:
            results["ring"][label] = ab_cell(command, args.reps, args.ab)
            for key, result in results["ring"][label].items():
                show(f"  {label} (ring {chunk * depth} MiB), {args.ab} {key}", result)
        else:
            results["ring"][label] = cell(command, args.reps)
            show(f"  {label} (ring {chunk * depth} MiB)", results["ring"][label])
    if args.only_ring:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return

    print("windows, threads x chunk (depth twice the threads)", flush=True)
    results["windows"] = {}
    for threads in (1, 2, 4, 8):
        for chunk in (8, 64):
            label = f"{threads}x{chunk}MiB"
            results["windows"][label] = cell(load(args.cli, files, "windows", threads, chunk, None), args.reps)
            show(f"  {label}", results["windows"][label])

    print("together: staged and windows in two processes at once, on halves", flush=True)
    halves = [files[0::2], files[1::2]]
    results["together"] = together(args.cli, halves, args.repeat, args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
