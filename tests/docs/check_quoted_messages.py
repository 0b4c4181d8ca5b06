#!/usr/bin/env python3
"""Fails when a page quotes a message that the code no longer prints.

    check_quoted_messages.py --root SRC [--sources src,include,drivers,perf] [--library DIR]... PAGE...

Which text is a quoted message (the convention of the pages checked):
  * every line of a ```text block (blocks tagged sh, cpp, ... are not messages; an untagged fence
    is refused, so a message block cannot slip out of the check by losing its tag);
  * every inline code span that starts with "lather-train: ", "lather-bench: " or
    "lather-checkpoint: " (it may run over one line break).

What is checked is a message's fixed text. The message is cut at what varies from run to run:
numbers, '...' and "..." quotations, [...] and {...} (also half-open [a, b)) lists, <...>
placeholders, an ellipsis, words holding a '/' (paths), and the strings the page lists in an
HTML comment `<!-- message values: lion | No such file or directory -->` (an unquoted user value,
or a library's text such as strerror's, which no heuristic can tell from fixed text); it is also
cut at ": ", where Lather joins a context made in one place to a message made in another.
Every piece with a letter must be in the string literals of the sources (adjacent literals
joined as the compiler joins them, cut at printf conversions and line breaks): inside one
literal, or as the end of one, at most two whole ones and the start of another, where the code
joins literals and names (`"GradientReducer::" + to_string(op)`, `concat(call, " failed: ")`,
`" = block_size"` + `"); choose ..."` + `" (on group rank "`); each part holds three letters or
more, or punctuation only. Next to a number, a piece must end (start) where a literal does,
unless the number belongs to the literal ("reads 1.." + version). Pieces are checked one by one:
two real pieces of two messages joined at a number pass ("--weight-shards " 3 " does not divide
the world size"). A message must keep 12 letters of fixed text, so that a quotation of numbers
and names alone is not waved through.
--library adds directories or headers that make messages too (CLI11's: "... not in {...}").
"""
import argparse
import pathlib
import re
import sys

PROGRAM_PREFIX = re.compile(r"lather-(?:train|bench|checkpoint): ")
# What varies between runs, most specific first (a placeholder may hold quotes, a quote a slash).
VARIABLE = re.compile(
    r"<[^<>\n]*>"                        # <what failed there>
    r"|'[^'\n]*'|\"[^\"\n]*\""           # 'layer1/kernel', "lather-checkpoint"
    r"|\[[^\[\]()\n]*[\])]|\{[^{}\n]*\}"  # [784, 16], [0, 8), {shampoo,adam}
    r"|\.\.\.|\u2026"                    # an elision
    r"|\S*/\S*"                          # run/checkpoint-000000001200.h5
    r"|(?<!\w)[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)")  # 3, -1, 0.42, 1e-6
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
PRINTF_CONVERSION = re.compile(r"%[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[hljztL]*[diouxXeEfFgGaAcsp]")
SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".cxx", ".hh", ".inl"}


def string_literals(text):
    """The string literals of a C++ file, adjacent ones joined (comments and chars skipped)."""
    literals, i, n = [], 0, len(text)
    joining = False  # the last token was a literal: a literal next joins it
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i) if text.find("\n", i) >= 0 else n
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == "'":  # a character literal, so that '"' does not open a string
            m = re.compile(r"'(?:[^'\\\n]|\\.)*'").match(text, i)
            i = m.end() if m else i + 1
            joining = False
        elif c == '"':
            m = re.compile(r'"((?:[^"\\\n]|\\.)*)"').match(text, i)
            if not m:
                i += 1
                continue
            body = re.sub(r"\\(.)", lambda e: {"n": "\n", "t": "\t"}.get(e.group(1), e.group(1)), m.group(1))
            if joining:
                literals[-1] += body
            else:
                literals.append(body)
            joining = True
            i = m.end()
        else:
            if not c.isspace():
                joining = False
            i += 1
    return literals


def literal_corpus(roots):
    """Every literal piece between NUL separators (for substring tests), and the set of them."""
    pieces = []
    for root in map(pathlib.Path, roots):
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if path.suffix in SOURCE_SUFFIXES and path.is_file():
                for literal in string_literals(path.read_text(errors="replace")):
                    for piece in PRINTF_CONVERSION.split(literal):
                        pieces.extend(piece.replace("%%", "%").split("\n"))
    return "\0" + "\0".join(pieces) + "\0", set(pieces)


def quoted_messages(page, lines):
    """(line number, message) for every quoted message of the page; errors for untagged fences."""
    messages, errors, fence = [], [], None
    prose = []  # (line number, text) outside fences, for inline spans
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence = stripped[3:].strip()
                if fence == "":
                    errors.append(f"{page}:{number}: a fence without a language: tag it (```text for messages)")
            else:
                fence = None
        elif fence == "text":
            if stripped:
                messages.append((number, stripped))
        elif fence is None:
            prose.append((number, line))
    # Inline spans may cross one line break: join each prose line with the next.
    for k, (number, line) in enumerate(prose):
        following = prose[k + 1][1] if k + 1 < len(prose) and prose[k + 1][0] == number + 1 else ""
        joined = line + "\n" + following
        for m in re.finditer(r"`([^`]+)`", joined):
            if m.start() < len(line) and PROGRAM_PREFIX.match(m.group(1)):
                messages.append((number, " ".join(m.group(1).split())))
    return messages, errors


def found(piece, corpus, whole, starts, ends):
    """In one literal, or the end of one literal, at most two whole literals and the start of
    another; starts/ends: the piece must start/end where a literal does (a number is next)."""
    if ("\0" if starts else "") + piece + ("\0" if ends else "") in corpus:
        return True

    # A part of one or two letters, or of spaces, would match the end of almost any literal: each
    # part holds at least three letters, or no letter and some punctuation (a ")" closing a context).
    def solid(part):
        letters = sum(ch.isalpha() for ch in part)
        return letters >= 3 or (letters == 0 and part.strip() != "")

    n = len(piece)
    reached = {cut for cut in range(1, n) if solid(piece[:cut])
               and (piece[:cut] in whole if starts else piece[:cut] + "\0" in corpus)}
    for _ in range(3):  # the cuts reached with 0, 1 and 2 whole literals after the first
        if any(solid(piece[cut:]) and (piece[cut:] in whole if ends else "\0" + piece[cut:] in corpus)
               for cut in reached):
            return True
        reached = {j for i in reached for j in range(i + 1, n) if piece[i:j] in whole and solid(piece[i:j])}
    return False


def unprinted(message, values, corpus, whole):
    """The pieces of fixed text no source prints, and the number of letters checked."""
    # Tokens (text, kind): fixed text, a number, or another variable part; ": " separates contexts.
    tokens, at = [], 0
    pattern = "|".join([re.escape(v) for v in values] + [VARIABLE.pattern])  # values first: may hold '/'
    for m in re.finditer(pattern, message):
        tokens.append((message[at:m.start()], "fixed"))
        tokens.append((m.group(), "number" if NUMBER.fullmatch(m.group()) else "value"))
        at = m.end()
    tokens.append((message[at:], "fixed"))
    split = []
    for text, kind in tokens:
        if kind != "fixed":
            split.append((text, kind))
            continue
        for k, part in enumerate(text.split(": ")):
            if k:
                split.append((": ", "separator"))
            split.append((part, "fixed"))
    kinds = [kind for _, kind in split] + ["end"]
    missing, letters, i = [], 0, 0
    while i < len(split):
        piece, kind = split[i]
        if kind != "fixed" or not re.search("[A-Za-z]", piece):
            i += 1
            continue
        # A number next to fixed text ends or starts a literal ("weight_shards " + 3), unless the
        # number is fixed text itself ("reads 1.." + version): then check the three as one piece.
        j = i
        while not found(piece, corpus, whole, i > 0 and kinds[i - 1] == "number", kinds[j + 1] == "number") \
                and kinds[j + 1] == "number" and kinds[j + 2] == "fixed":
            piece += split[j + 1][0] + split[j + 2][0]
            j += 2
        if not found(piece, corpus, whole, i > 0 and kinds[i - 1] == "number", kinds[j + 1] == "number"):
            missing.append(split[i][0].strip())
        letters += sum(ch.isalpha() for ch in piece)
        i = j + 1
    return missing, letters


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="source directory")
    parser.add_argument("--sources", default="src,include,drivers,perf", help="comma-separated, under --root")
    parser.add_argument("--library", action="append", default=[],
                        help="another directory (or header) of message sources")
    parser.add_argument("pages", nargs="+")
    args = parser.parse_args()
    root = pathlib.Path(args.root)
    corpus, whole = literal_corpus([root / d for d in args.sources.split(",")] + args.library)

    problems, checked = [], 0
    for page in args.pages:
        path = pathlib.Path(page)
        name = path.relative_to(root) if path.is_relative_to(root) else path
        text = path.read_text()
        values = [v.strip() for c in re.findall(r"<!--\s*message values:(.*?)-->", text, re.S)
                  for v in c.split("|") if v.strip()]
        messages, errors = quoted_messages(name, text.split("\n"))
        problems += errors
        if not messages:
            problems.append(f"{name}: no quoted message found (```text blocks, `lather-train: ...` spans)")
        for number, message in messages:
            checked += 1
            missing, letters = unprinted(message, values, corpus, whole)
            if missing:
                problems.append(f"{name}:{number}: no source prints " + ", ".join(f"'{p}'" for p in missing)
                                + f"\n    in: {message}")
            elif letters < 12:
                problems.append(f"{name}:{number}: too little fixed text to check (quote more of the "
                                f"message, or list fewer values)\n    in: {message}")
    if problems:
        print(f"{len(problems)} quoted messages are not what the code prints (see the convention at the "
              f"top of {pathlib.Path(__file__).name}):\n  " + "\n  ".join(problems))
        return 1
    print(f"{checked} quoted messages of {len(args.pages)} pages are in the sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
