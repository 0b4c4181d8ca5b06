#!/usr/bin/python3
"""Writes docs/results.md and its plots from the benchmark records in perf/results/*.jsonl.

    python3 perf/results_page.py                      # docs/results.md and docs/results/*.png
    python3 perf/results_page.py --output-dir DIR     # DIR/results.md and DIR/results/*.png
    python3 perf/results_page.py --no-plots           # the page only (needs no matplotlib)

The page is a function of the records alone: the same records give the same markdown, byte for
byte, so a test can regenerate it and compare (tests/docs: docs_results_page). The record format
is in perf/results/README.md. The plots need matplotlib (Debian: python3-matplotlib)."""

import argparse
import datetime
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REQUIRED = ("date", "commit", "machine", "command")

# Keys that say where and how a figure was taken, or what case it is; the rest are figures.
PROVENANCE = ("date", "commit", "commit_source", "machine", "command", "measurement", "note")
CASE = ("bench", "model", "ranks", "optimizer", "baseline", "set", "root_method", "op", "bytes", "n",
        "batch", "p", "method", "precision", "target_loss", "target")
# Shown in the history tables beside the date, commit and machine.
CONTEXT = ("backend", "build", "blas_kernels", "variant", "load")

# The headline measurements, in the order of the current table, with what each compares.
HEADLINES = [
    ("tta-mlp-2ranks", "time to 88% on Fashion-MNIST, Shampoo ÷ Adam, 2 ranks",
     ["ratio_seconds", "ratio_steps", "steps", "seconds", "baseline_steps", "baseline_seconds"]),
    ("tta-mlp-1rank", "time to 88% on Fashion-MNIST, Shampoo ÷ Adam, 1 rank",
     ["ratio_seconds", "ratio_steps", "steps", "baseline_steps"]),
    ("tta-mlp-scaling", "Shampoo samples/s on Fashion-MNIST, 2 ranks ÷ 1 rank",
     ["ratio_2_to_1", "samples_per_second_1_rank", "samples_per_second_2_ranks", "ratio_2_to_1_cpu"]),
    ("tta-transformer-2ranks", "time to 1.8 nats/char on Shakespeare, Shampoo ÷ AdamW, 2 ranks",
     ["ratio_seconds", "steps", "seconds", "baseline_steps", "baseline_seconds", "seed"]),
    ("tta-transformer-1rank", "time to 1.8 nats/char on Shakespeare, Shampoo ÷ Adam, 1 rank",
     ["ratio_seconds", "root_method", "steps", "seconds", "baseline_steps", "baseline_seconds"]),
    ("step-transformer-eigh-1rank", "optimizer step, transformer set, Shampoo (eigh roots) ÷ Adam",
     ["ratio_to_adam", "seconds_per_step", "roots_seconds_per_step", "adam_seconds_per_step",
      "product_floor_ratio_to_adam"]),
    ("step-transformer-newton-1rank", "optimizer step, transformer set, Shampoo (Newton roots) ÷ Adam",
     ["ratio_to_adam", "seconds_per_step", "roots_seconds_per_step"]),
    ("reduce-mean-1M-2ranks", "gradient mean of 1 MiB ÷ raw MPI_Allreduce, bandwidth",
     ["bandwidth_ratio", "ratio_to_raw"]),
    ("reduce-mean-16M-2ranks", "gradient mean of 16 MiB ÷ raw MPI_Allreduce, bandwidth",
     ["bandwidth_ratio", "ratio_to_raw"]),
    ("reduce-mean-64M-2ranks", "gradient mean of 64 MiB ÷ raw MPI_Allreduce, bandwidth",
     ["bandwidth_ratio", "ratio_to_raw"]),
    ("root-eigh-float64-n128", "eigh inverse roots, n = 128, float64, roots/s",
     ["roots_per_second", "host_threads"]),
    ("root-newton-float32-n128-batch64", "batched Newton inverse roots, n = 128, batches of 64, float32",
     ["roots_per_second", "ratio", "gemm_gflops"]),
    ("checkpoint-256M-4ranks", "checkpoint of 256 MiB on 4 ranks ÷ raw POSIX I/O",
     ["ratio_read", "ratio_write", "read_gbps", "write_gbps"]),
    ("checkpoint-1G-4ranks", "checkpoint of 1 GiB on 4 ranks ÷ raw POSIX I/O",
     ["ratio_read", "ratio_write", "read_gbps", "write_gbps"]),
]

PLOTS = [
    ("tta-ratio-seconds.png", "Time to target, Shampoo's seconds over the baseline's (below 1: Shampoo is faster)"),
    ("tta-scaling.png", "Shampoo samples/s on 2 ranks over 1 rank, Fashion-MNIST MLP"),
    ("step-ratio-to-adam.png", "Shampoo's optimizer step over Adam's, transformer set, 1 rank"),
    ("reduce-mean.png", "Gradient mean over raw MPI_Allreduce, bandwidth, 2 ranks"),
    ("checkpoint-ratios.png", "Checkpoint over raw POSIX I/O, 4 ranks, 256 MiB"),
    ("root-throughput.png", "Inverse roots per second against n, batches of 16 and 64 (the newest figure of each n)"),
]


def ranks_suffix(ranks):
    return f"{ranks}rank" + ("" if ranks == 1 else "s")


def bytes_label(count):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if isinstance(count, int) and count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def measurement_of(record):
    """The record's measurement name: its own `measurement` key, else one derived from the
    lather-bench case keys, so that lines saved by perf/record join the history of their kind."""
    if "measurement" in record:
        return record["measurement"]
    bench = record.get("bench", "unknown")
    ranks = record.get("ranks", 1)
    if bench == "root":
        return f"root-{record.get('method')}-{record.get('precision')}-n{record.get('n')}-batch{record.get('batch')}"
    if bench == "step":
        optimizer = record.get("optimizer", "shampoo")
        what = record.get("root_method") if optimizer == "shampoo" else optimizer
        return f"step-{record.get('set')}-{what}-{ranks_suffix(ranks)}"
    if bench == "tta":
        model = record.get("model", "mlp")
        optimizer = record.get("optimizer", "shampoo")
        if optimizer == "shampoo":
            return f"tta-{model}-{ranks_suffix(ranks)}"
        return f"tta-{model}-{optimizer}-{ranks_suffix(ranks)}"
    if bench == "reduce":
        return f"reduce-{record.get('op')}-{bytes_label(record.get('bytes'))}-{ranks_suffix(ranks)}"
    if bench == "checkpoint":
        return f"checkpoint-{bytes_label(record.get('bytes'))}-{ranks_suffix(ranks)}"
    if bench == "balance":
        return f"balance-{record.get('set')}-block{record.get('block_size')}-{ranks_suffix(ranks)}"
    return bench


def load(results_dir):
    records = []
    files = sorted(glob.glob(os.path.join(results_dir, "*.jsonl")))
    if not files:
        sys.exit(f"results_page: no *.jsonl under {results_dir}")
    for path in files:
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{name}:{number}: not JSON ({e})")
                if not isinstance(record, dict):
                    sys.exit(f"{name}:{number}: not a JSON object")
                missing = [k for k in REQUIRED if not record.get(k)]
                if missing:
                    sys.exit(f"{name}:{number}: missing {', '.join(missing)}")
                try:
                    datetime.date.fromisoformat(str(record["date"])[:10])
                except ValueError:
                    sys.exit(f"{name}:{number}: date '{record['date']}' is not ISO (YYYY-MM-DD)")
                record["_where"] = (name, number)
                record["_measurement"] = measurement_of(record)
                records.append(record)
    return files, records


def order(record):
    """Oldest first: by date, then by place in the files (a file is appended in time order)."""
    return (str(record["date"]), record["_where"])


def number(value):
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, ".4g") if abs(value) < 1e6 else format(value, ".6g")
    return str(value)


def is_time(key):
    return key.endswith(("seconds", "seconds_per_step")) and not key.startswith("ratio") \
        and "per_second" not in key.replace("seconds_per_step", "")


def value_text(key, value):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and is_time(key):
        if 0 < abs(value) < 1:
            return format(value * 1000, ".4g") + " ms"
        return format(value, ".4g") + " s"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return number(value)


def figures(record, keys=None):
    """'key value' pairs of a record's figures; key_min and key_max as one 'key a-b'."""
    names = [k for k in record if not k.startswith("_") and k not in PROVENANCE and k not in CASE
             and k not in CONTEXT]
    bases = []
    for k in names:
        base = k[:-4] if k.endswith(("_min", "_max")) else k
        if base not in bases:
            bases.append(base)
    if keys is not None:
        bases = [k for k in keys if k in bases]
    out = []
    for base in bases:
        if base in record:
            out.append(f"{base} {value_text(base, record[base])}")
        elif base + "_min" in record or base + "_max" in record:
            low = value_text(base, record.get(base + "_min", "?"))
            high = value_text(base, record.get(base + "_max", "?"))
            for unit in (" ms", " s"):
                if low.endswith(unit) and high.endswith(unit):
                    low = low[:-len(unit)]
                    break
            out.append(f"{base} {low}-{high}")
    return out


def session_key(record):
    return (str(record["date"]), record["commit"], record["machine"], record["command"])


def combined(records, keys):
    """One figure text for the records of one session: each key's values listed in order, or
    their range when there are more than four."""
    parts = []
    for key in keys:
        values, lows, highs = [], [], []
        for r in records:
            if key in r:
                values.append(r[key])
            if key + "_min" in r:
                lows.append(r[key + "_min"])
            if key + "_max" in r:
                highs.append(r[key + "_max"])
        if not values and not lows:
            continue
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values + lows + highs)
        distinct = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in values))
        if lows or highs or (numeric and len(distinct) > 4):
            if numeric:
                low = min(values + lows)
                high = max(values + highs)
                text = figures({key + "_min": low, key + "_max": high}, [key])[0] if low != high \
                    else f"{key} {value_text(key, low)}"
            else:
                text = f"{key} " + ", ".join(value_text(key, json.loads(v)) for v in distinct)
        else:
            text = f"{key} " + ", ".join(value_text(key, json.loads(v)) for v in distinct)
        parts.append(text)
    return "; ".join(parts)


def current_machines(records):
    """The machine of the newest GPU records and that of the newest CPU records (GPU: a machine
    named NVIDIA or AMD Instinct); ties go to the machine with more records, then by name."""
    kinds = {}
    for r in records:
        gpu = any(word in r["machine"] for word in ("NVIDIA", "Instinct", "Radeon"))
        kinds.setdefault(gpu, {}).setdefault(r["machine"], []).append(r)
    out = []
    for gpu in (False, True):
        machines = kinds.get(gpu, {})
        if machines:
            best = max(machines, key=lambda m: (max(str(r["date"]) for r in machines[m]), len(machines[m]), m))
            out.append(best)
    return out


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text):
    text = str(text)
    tick = "``" if "`" in text else "`"
    return f"{tick}{text}{tick}".replace("|", "\\|")


def write_page(path, files, records, plots):
    by_measurement = {}
    for r in records:
        by_measurement.setdefault(r["_measurement"], []).append(r)
    for rs in by_measurement.values():
        rs.sort(key=order)
    lines = []
    add = lines.append
    add("# Benchmark results")
    add("")
    add("<!-- Generated by `python3 perf/results_page.py` from perf/results/*.jsonl: do not edit. -->")
    add("")
    add("This page is generated: `python3 perf/results_page.py` writes it, and its plots under")
    add("[results/](results/), from the records in [perf/results/](../perf/results/README.md)")
    add(f"({len(records)} records in {len(files)} files). Do not edit it by hand: add records")
    add("(`perf/record perf/results/<file>.jsonl -- <lather-bench command>`) and run the command again.")
    add("The test `docs_results_page` fails when this page differs from what the records give.")
    add("What each benchmark measures and how to run it: [reference/benchmarks.md](reference/benchmarks.md).")
    add("")
    add("Compare figures taken on the same machine; the machines are shared VMs unless said, and the")
    add("ratios to a baseline measured in the same run are what carry from one run to the next.")
    add("")
    add("## Current figures")
    add("")
    add("The newest session of each headline measurement on the machine of the newest CPU records and")
    add("on that of the newest GPU records (a session: the records of one date, commit and machine;")
    add("several rounds are listed in order, more than four as a range). Older machines' figures are")
    add("under [History](#history).")
    add("")
    add("| measurement | machine | figures | date | commit | command |")
    add("| --- | --- | --- | --- | --- | --- |")
    current = current_machines(records)
    for name, title, keys in HEADLINES:
        rs = by_measurement.get(name, [])
        for machine in current:
            mine = [r for r in rs if r["machine"] == machine]
            if not mine:
                continue
            newest = session_key(mine[-1])[:3]
            session = [r for r in mine if session_key(r)[:3] == newest]
            for command in dict.fromkeys(r["command"] for r in session):
                same = [r for r in session if r["command"] == command]
                text = combined(same, keys) or "; ".join(figures(same[-1]))
                add(f"| {cell(title)} | {cell(machine)} | {cell(text)} | {newest[0]} | {code(newest[1])} | {code(command)} |")
    add("")
    add("## Plots")
    add("")
    for name, title in plots:
        add(f"![{title}](results/{name})")
        add("")
    add("## Machines")
    add("")
    add("| machine | records | first | last |")
    add("| --- | --- | --- | --- |")
    machines = {}
    for r in records:
        machines.setdefault(r["machine"], []).append(str(r["date"]))
    for machine in sorted(machines):
        dates = sorted(machines[machine])
        add(f"| {cell(machine)} | {len(dates)} | {dates[0]} | {dates[-1]} |")
    add("")
    add("## History")
    add("")
    add("Every record of each measurement, oldest first. `commit` is the commit the figure was taken")
    add("at, or, marked *(recorded)*, the commit that first wrote it down where its source named none.")
    add("")
    for name in sorted(by_measurement):
        rs = by_measurement[name]
        add(f"### {name}")
        add("")
        add("| date | commit | machine | figures | command | note |")
        add("| --- | --- | --- | --- | --- | --- |")
        for r in rs:
            commit = code(r["commit"]) + (" *(recorded)*" if r.get("commit_source") == "recorded" else "")
            context = [f"{k} {value_text(k, r[k])}" for k in CONTEXT if k in r]
            case = [f"{k} {value_text(k, r[k])}" for k in CASE if k in r and k != "bench"]
            shown = "; ".join(figures(r)) or "-"
            note = "; ".join(x for x in [", ".join(case), ", ".join(context), r.get("note", "")] if x)
            add(f"| {r['date']} | {commit} | {cell(r['machine'])} | {cell(shown)} | {code(r['command'])} | {cell(note)} |")
        add("")
    text = "\n".join(lines).rstrip("\n") + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def when(record):
    return datetime.datetime.fromisoformat(str(record["date"])[:10])


def point(record, key):
    """(value, low, high) of a key, from the key itself or its _min/_max."""
    if key in record and isinstance(record[key], (int, float)):
        v = record[key]
        return v, v, v
    low, high = record.get(key + "_min"), record.get(key + "_max")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return (low + high) / 2, low, high
    return None


def series_plot(plt, path, title, groups, key, ylabel, log=False, hline=None):
    fig, ax = plt.subplots(figsize=(9, 4.8))
    drawn = False
    for label in sorted(groups):
        pts = [(when(r), point(r, key)) for r in sorted(groups[label], key=order)]
        pts = [(t, p) for t, p in pts if p is not None]
        if not pts:
            continue
        # Records of one day spread over it, in order, so that rounds do not hide each other.
        per_day = {}
        xs = []
        for t, _ in pts:
            i = per_day.get(t, 0)
            per_day[t] = i + 1
            xs.append((t, i))
        counts = {t: n for t, n in per_day.items()}
        x = [t + datetime.timedelta(hours=2 + 20 * i / max(counts[t], 1)) for t, i in xs]
        y = [p[0] for _, p in pts]
        err = [[p[0] - p[1] for _, p in pts], [p[2] - p[0] for _, p in pts]]
        ax.errorbar(x, y, yerr=err, fmt="o", markersize=3.5, linewidth=0.8, capsize=2, label=label)
        drawn = True
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--")
    if log:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def write_plots(outdir, records):
    try:
        import matplotlib
    except ImportError:
        sys.exit("results_page: the plots need matplotlib (Debian: apt install python3-matplotlib; "
                 "/usr/bin/python3 has it there); --no-plots writes the page alone")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(outdir, exist_ok=True)

    def groups(select, label):
        out = {}
        for r in records:
            if select(r):
                out.setdefault(label(r), []).append(r)
        return out

    m = lambda r: r["_measurement"]  # noqa: E731
    series_plot(plt, os.path.join(outdir, PLOTS[0][0]), PLOTS[0][1],
                groups(lambda r: m(r) in ("tta-mlp-2ranks", "tta-mlp-1rank", "tta-transformer-2ranks",
                                          "tta-transformer-1rank"),
                       lambda r: f"{m(r)}: {r['machine']}"),
                "ratio_seconds", "ratio_seconds", hline=1.0)
    series_plot(plt, os.path.join(outdir, PLOTS[1][0]), PLOTS[1][1],
                groups(lambda r: m(r) == "tta-mlp-scaling", lambda r: r["machine"]),
                "ratio_2_to_1", "samples/s, 2 ranks ÷ 1 rank", hline=2.0)
    series_plot(plt, os.path.join(outdir, PLOTS[2][0]), PLOTS[2][1],
                groups(lambda r: m(r) in ("step-transformer-eigh-1rank", "step-transformer-newton-1rank"),
                       lambda r: f"{r.get('root_method')}: {r['machine']}"),
                "ratio_to_adam", "Shampoo step ÷ Adam step", log=True)
    series_plot(plt, os.path.join(outdir, PLOTS[3][0]), PLOTS[3][1],
                groups(lambda r: m(r) in ("reduce-mean-1M-2ranks", "reduce-mean-16M-2ranks", "reduce-mean-64M-2ranks"),
                       lambda r: f"{bytes_label(r.get('bytes'))}: {r['machine']}"),
                "bandwidth_ratio", "bandwidth_ratio", hline=1.0)
    # Reads and writes of the same records as two series per machine: the key renamed to "_y".
    both = {}
    for r in records:
        if m(r) != "checkpoint-256M-4ranks":
            continue
        for key in ("ratio_read", "ratio_write"):
            if point(r, key) is None:
                continue
            renamed = {k.replace(key, "_y"): v for k, v in r.items() if k.startswith(key)}
            both.setdefault(f"{key[6:]}: {r['machine']}", []).append(dict(r, **renamed))
    series_plot(plt, os.path.join(outdir, PLOTS[4][0]), PLOTS[4][1], both, "_y",
                "checkpoint ÷ raw (ratio_read, ratio_write)", hline=1.0)

    # Roots per second against n: the newest session of each machine, per method and batch.
    fig, ax = plt.subplots(figsize=(11, 4.8))
    roots = [r for r in records if r.get("bench") == "root" and point(r, "roots_per_second")
             and isinstance(r.get("n"), int) and r.get("batch") in (16, 64)]
    lines = {}
    for r in sorted(roots, key=order):
        label = (r["machine"], r.get("method"), r.get("precision"), r.get("batch"), r.get("host_threads"))
        lines.setdefault(label, {})[r["n"]] = r
    for label in sorted(lines, key=lambda t: tuple(str(x) for x in t)):
        byn = lines[label]
        if len(byn) < 2:
            continue
        ns = sorted(byn)
        machine, method, precision, batch, threads = label
        text = f"{method} {precision}, batch {batch}" + (f", {threads} threads" if threads else "") + f": {machine}"
        ax.plot(ns, [point(byn[n], "roots_per_second")[0] for n in ns], marker="o", markersize=3.5,
                linewidth=1, label=text)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel("roots per second")
    ax.set_title(PLOTS[5][1], fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, PLOTS[5][0]), dpi=110, metadata={"Software": None})
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=os.path.join(HERE, "results"),
                        help="directory of the *.jsonl records (default: perf/results)")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "docs"),
                        help="where results.md and results/*.png go (default: docs)")
    parser.add_argument("--no-plots", action="store_true", help="write the page only")
    args = parser.parse_args()
    files, records = load(args.results)
    os.makedirs(args.output_dir, exist_ok=True)
    write_page(os.path.join(args.output_dir, "results.md"), files, records, PLOTS)
    if not args.no_plots:
        write_plots(os.path.join(args.output_dir, "results"), records)
    print(f"results_page: {len(records)} records -> {os.path.join(args.output_dir, 'results.md')}"
          + ("" if args.no_plots else f" and {len(PLOTS)} plots"))


if __name__ == "__main__":
    main()
