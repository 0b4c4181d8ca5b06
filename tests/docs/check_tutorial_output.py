#!/usr/bin/env python3
"""Fails when the output docs/tutorial.md shows is not what the tutorial's commands print.

    check_tutorial_output.py --page docs/tutorial.md --program lather-tutorial --work DIR
                             --mpiexec=MPIEXEC --numproc-flag=-n [--preflags="A;B"]

The page's ```sh block holds the commands (`mpiexec -n R .../lather-tutorial DIR STEPS`); the
block after the comment `<!-- docs_tutorial_output -->` holds what they print. This script runs
the same commands, in order, with the built program, this launcher and a fresh directory WORK in
place of the page's DIR, and compares the concatenated stdout with that block line by line.

Normalisation, on both sides: the path WORK is written as the page's DIR, and durations (a number
followed by s or ms), which vary from run to run, become <duration>. The memory report is
compared digit for digit. The losses ("mean loss X") are deterministic on one machine (the same
build prints the same digits every run) but not across BLAS kernels: OpenBLAS's AVX-512 and AVX2
kernels round the float products otherwise, which 40 steps of Shampoo on this nearly solved
least-squares problem carry to 1.6% of a loss of 6e-4 (0.000600 against 0.000591). They must agree
to LOSS_TOLERANCE relative; a lost reduction or a resume from the wrong step moves them several-fold.
"""
import argparse
import pathlib
import re
import shutil
import subprocess
import sys

MARKER = "<!-- docs_tutorial_output"
DURATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)? ?m?s\b")
LOSS = re.compile(r"mean loss (\S+)")
LOSS_TOLERANCE = 0.05


def page_parts(lines):
    """The commands [(line number, ranks, directory, steps)] and the documented output [(line number, text)]."""
    commands, output, fence, after_marker = [], [], None, False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith(MARKER):
            after_marker = True
        elif stripped.startswith("```"):
            if fence is None:
                fence = "output" if after_marker else stripped[3:]
            else:
                if fence == "output":
                    return commands, output
                fence = None
        elif fence == "sh":
            m = re.match(r"mpiexec -n (\d+) \S*lather-tutorial (\S+) (\d+)", stripped)
            if m:
                commands.append((number, m.group(1), m.group(2), m.group(3)))
        elif fence == "output":
            output.append((number, line.rstrip()))
    return commands, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--page", required=True)
    parser.add_argument("--program", required=True, help="the built lather-tutorial")
    parser.add_argument("--work", required=True, help="checkpoint directory, emptied first")
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--numproc-flag", default="-n")
    parser.add_argument("--preflags", default="", help="mpiexec flags before the program, ';'-separated")
    args = parser.parse_args()
    page = pathlib.Path(args.page)
    commands, documented = page_parts(page.read_text().split("\n"))
    if not commands:
        print(f"{page}: no `mpiexec -n R .../lather-tutorial DIR STEPS` line in a ```sh block")
        return 1
    if documented is None:
        print(f"{page}: no ``` block after a line starting with '{MARKER}' (the documented output)")
        return 1
    directories = {directory for _, _, directory, _ in commands}
    if len(directories) != 1:
        print(f"{page}: the commands use several directories ({', '.join(sorted(directories))}); the runs share one")
        return 1
    directory = directories.pop()

    work = pathlib.Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    printed = []
    for number, ranks, _, steps in commands:
        command = [args.mpiexec, args.numproc_flag, ranks] + [f for f in args.preflags.split(";") if f] \
            + [args.program, str(work), steps]
        run = subprocess.run(command, capture_output=True, text=True, timeout=240)
        if run.returncode != 0:
            print(f"{page}:{number}: the command exited with {run.returncode}: {' '.join(command)}\n"
                  f"{run.stdout}{run.stderr}")
            return 1
        printed += run.stdout.rstrip("\n").split("\n")

    def normal(line):
        return DURATION.sub("<duration>", line.replace(str(work), directory))

    def same(expected, got):
        """The lines agree: the same text, and losses within LOSS_TOLERANCE of each other."""
        shown, printed_losses = LOSS.findall(expected), LOSS.findall(got)
        if LOSS.sub("mean loss <loss>", expected) != LOSS.sub("mean loss <loss>", got):
            return False
        try:
            return all(abs(float(a) - float(b)) <= LOSS_TOLERANCE * abs(float(a))
                       for a, b in zip(shown, printed_losses))
        except ValueError:
            return shown == printed_losses

    actual = [normal(line) for line in printed]
    for k, (number, expected) in enumerate(documented):
        got = actual[k] if k < len(actual) else "(nothing more)"
        if not same(normal(expected), got):
            print(f"{page}:{number}: the page shows\n    {expected}\n  the commands print (normalised)\n    {got}\n"
                  f"everything they print:\n    " + "\n    ".join(actual))
            return 1
    if len(actual) > len(documented):
        print(f"{page}:{documented[-1][0] + 1 if documented else 0}: the commands print more than the page "
              f"shows:\n    " + "\n    ".join(actual[len(documented):]))
        return 1
    print(f"the {len(documented)} lines of output {page.name} shows are what its {len(commands)} commands print")
    return 0


if __name__ == "__main__":
    sys.exit(main())
