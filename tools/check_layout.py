#!/usr/bin/env python3
"""Checks a header's layout, as its doc block promises: the table of contents
names the "// >>" section markers, in order and nothing else, and no code in
a section calls a function defined in a later section (recursion within a
section is fine). Used by CI.

usage: tools/check_layout.py HEADER..."""
import re, sys


def strip(text):
    """Comments and string literals blanked, line breaks kept."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text, flags=re.S)


def check(path):
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    problems = []
    toc = []
    m = re.search(r"Table of contents[^\n]*\n((?: *// >>\w+[^\n]*\n)+)", text)
    if m:
        toc = re.findall(r"// >>(\w+)", m.group(1))
    markers = [(i, m.group(1)) for i, l in enumerate(lines) for m in [re.match(r"// >>(\w+)", l)] if m]
    if not toc:
        problems.append("no table of contents")
    elif toc != [name for _, name in markers]:
        problems.append("the table of contents %s does not match the section markers %s" % (toc, [n for _, n in markers]))
    code = strip(text).split("\n")
    section, where = [None] * len(lines), None
    starts = dict(markers)
    for i in range(len(lines)):
        where = starts.get(i, where)
        section[i] = where
    order = {name: k for k, (_, name) in enumerate(markers)}
    defined = {}
    for i, l in enumerate(code):
        d = re.match(r"^(?:static|HIRDEF)\b[^=;]*?\b(\w+)\s*\([^;]*$", l)
        if d and section[i] not in (None, "api"):
            defined.setdefault(d.group(1), section[i])
    for i, l in enumerate(code):
        if section[i] in (None, "api"):  # declarations, not calls
            continue
        for c in re.finditer(r"\b(\w+)\s*\(", l):
            f = c.group(1)
            if f in defined and order[defined[f]] > order[section[i]]:
                problems.append("line %d (>>%s) calls %s, which >>%s defines later" % (i + 1, section[i], f, defined[f]))
    for p in problems[:20]:
        print("%s: %s" % (path, p))
    return not problems


if len(sys.argv) < 2:
    sys.exit(__doc__)
ok = all([check(p) for p in sys.argv[1:]])
print("layout: %s" % ("the tables of contents match the markers, and no section calls a later one" if ok else "FAILED"))
sys.exit(0 if ok else 1)
