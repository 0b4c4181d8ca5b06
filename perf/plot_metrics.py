#!/usr/bin/python3
"""Loss and accuracy curves from lather-train --metrics files, one line per file, as a PNG
(the MLP's test loss and accuracy, or the transformer's validation loss and accuracy).

    perf/plot_metrics.py shampoo.jsonl adam.jsonl -o curves.png [--labels shampoo,adam] [--x step|seconds]

Uses Debian's python3-matplotlib (no other packages)."""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    train, test = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e})")
            if "train_accuracy" in record:
                train.append(record)
            if "test_accuracy" in record and not record.get("final"):
                test.append(record)
            # The transformer's validation lines: the same roles under their own names.
            if "validation_loss" in record and "validation_accuracy" in record:
                test.append(dict(record, test_loss=record["validation_loss"],
                                 test_accuracy=record["validation_accuracy"]))
    if not train and not test:
        sys.exit(f"{path}: no metrics lines (was it written by lather-train --metrics?)")
    return train, test


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="metrics files (JSON lines)")
    parser.add_argument("-o", "--output", default="curves.png", help="PNG to write")
    parser.add_argument("--labels", help="comma-separated labels (default: file names)")
    parser.add_argument("--x", choices=["step", "seconds"], default="step", help="horizontal axis")
    args = parser.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.splitext(os.path.basename(f))[0] for f in args.files]
    if len(labels) != len(args.files):
        sys.exit("--labels needs one label per file")

    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path, label in zip(args.files, labels):
        train, test = read(path)
        if train:
            loss_axis.plot([r[args.x] for r in train], [r["loss"] for r in train], label=f"{label} train")
            accuracy_axis.plot([r[args.x] for r in train], [100 * r["train_accuracy"] for r in train],
                               alpha=0.4, label=f"{label} train")
        if test:
            kind = "validation" if "validation_loss" in test[0] else "test"
            loss_axis.plot([r[args.x] for r in test], [r["test_loss"] for r in test], "o--", label=f"{label} {kind}")
            accuracy_axis.plot([r[args.x] for r in test], [100 * r["test_accuracy"] for r in test], "o-",
                               label=f"{label} {kind}")
    loss_axis.set(xlabel=args.x, ylabel="cross-entropy", title="loss", yscale="log")
    accuracy_axis.set(xlabel=args.x, ylabel="accuracy (%)", title="accuracy")
    for axis in (loss_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
