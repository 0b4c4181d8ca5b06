#!/usr/bin/env python3
"""Fails when a page lists lather-train's optimizers or models otherwise than its --help does.

    check_option_lists.py --train LATHER_TRAIN --root SRC PAGE...

The names come from `lather-train --help`: the text of the --optimizer (--model) option, its line
and the description lines under it, holds them either as CLI11's set, `TEXT:{shampoo,soap,...}`,
or, failing that, as the first list `a, b, ... or c` of the description.

What is compared, on every page given:
  * quoted CLI11 messages `--optimizer: lion not in {...}`: the set, in the help's order;
  * the `--optimizer` and `--model` rows of an options table: the backticked names at the start of
    the meaning cell (up to its first ". ") are the whole set;
  * prose: a run of names joined only by ", ", "/", "or", "and", backticks or an opening
    parenthesis ("Shampoo (or Adam, AdamW") that names more than half of them is a list of them
    and must name every one; fewer make a statement about some ("Shampoo, SOAP and Muon check").
    A run followed by a number gives the names a value ("adam/adamw 2e-3") and is not a list. A name the program dropped is caught in the table and the messages, where
    the lists are exact; prose runs are found by the names the program has.
"""
import argparse
import pathlib
import re
import subprocess
import sys


def help_names(help_text, option):
    """The names the help gives for --option, in its order; [] when it names none."""
    lines = help_text.split("\n")
    for k, line in enumerate(lines):
        if re.match(rf"\s*--{option}\b", line):
            block = [line]
            # CLI11 puts a long description on the following, deeper-indented lines.
            for following in lines[k + 1:]:
                if not following.strip() or following.lstrip().startswith("-"):
                    break
                block.append(following)
            text = " ".join(block)
            braces = re.search(r"\{([^{}]*)\}", text)
            if braces:
                return [n.strip() for n in braces.group(1).split(",") if n.strip()]
            comma_list = re.search(r"[a-z][\w-]*(?:, [a-z][\w-]*)*,? (?:or|and) [a-z][\w-]*", text)
            return re.split(r",? (?:or|and) |, ", comma_list.group()) if comma_list else []
    return []


def prose_runs(text, names):
    """(offset, [names]) for every run of names joined by list separators only."""
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))  # adamw before adam
    matches = list(re.finditer(rf"\b(?:{alternatives})\b", text, re.IGNORECASE))
    gap = re.compile(r"[\s`*(]*(?:[,/][\s`*]*)?(?:(?:or|and)\s[\s`*]*)?")
    runs, run = [], []
    for m in matches:
        if run and gap.fullmatch(text[run[-1].end():m.start()]):
            run.append(m)
        else:
            runs.append(run)
            run = [m]
    runs.append(run)
    result = []
    for run in runs:
        if run and not re.match(r"[\s`*]*[-+]?\d", text[run[-1].end():]):  # "adam/adamw 2e-3": a value
            result.append((run[0].start(), [m.group().lower() for m in run]))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", required=True, help="the lather-train program")
    parser.add_argument("--root", required=True, help="source directory, for the names in messages")
    parser.add_argument("pages", nargs="+")
    args = parser.parse_args()
    run = subprocess.run([args.train, "--help"], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        print(f"{args.train} --help failed ({run.returncode}):\n{run.stdout}{run.stderr}")
        return 1
    known = {option: help_names(run.stdout, option) for option in ("optimizer", "model")}
    for option, names in known.items():
        if len(names) < 2:
            print(f"cannot read the names of --{option} from lather-train --help (parser: "
                  f"{pathlib.Path(__file__).name}); its line reads:\n"
                  + "\n".join(line for line in run.stdout.split("\n") if f"--{option}" in line))
            return 1

    problems, compared = [], 0
    root = pathlib.Path(args.root)
    for page in args.pages:
        path = pathlib.Path(page)
        name = path.relative_to(root) if path.is_relative_to(root) else path
        text = path.read_text()

        def where(offset):
            return f"{name}:{text.count(chr(10), 0, offset) + 1}"

        for option, names in known.items():
            expected = ", ".join(names)
            for m in re.finditer(rf"--{option}: \S+ not in \{{([^}}]*)\}}", text):
                compared += 1
                if m.group(1).split(",") != names:
                    problems.append(f"{where(m.start())}: the message lists {{{m.group(1)}}}, "
                                    f"lather-train --help {{{','.join(names)}}}")
            for m in re.finditer(rf"^\| `--{option}[ `][^|]*\|[^|]*\|([^|]*)\|", text, re.MULTILINE):
                compared += 1
                cell = m.group(1).split(". ")[0]
                listed = [n for n in re.findall(r"`([^`]+)`", cell) if not n.startswith("-")]
                if sorted(listed) != sorted(names):
                    problems.append(f"{where(m.start())}: the --{option} row lists {', '.join(listed)}; "
                                    f"lather-train --help: {expected}")
            for offset, listed in prose_runs(text, names):
                if 2 * len(set(listed)) > len(names):
                    compared += 1
                    if set(listed) != set(names):
                        missing = [n for n in names if n not in listed]
                        problems.append(f"{where(offset)}: a list of {option}s without {', '.join(missing)} "
                                        f"(lather-train --help: {expected})")
    if problems:
        print(f"{len(problems)} lists differ from lather-train --help (see the top of "
              f"{pathlib.Path(__file__).name}):\n  " + "\n  ".join(problems))
        return 1
    print(f"{compared} lists of {len(args.pages)} pages match lather-train --help: optimizers "
          f"{', '.join(known['optimizer'])}; models {', '.join(known['model'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
