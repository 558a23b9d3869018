#!/usr/bin/env python3
"""Checks the golden dumps of the lowered seed fusions (tests/golden/seed_*.txt,
which the C tests compare with hir_lower's output) against nvFuser's own dumps
in the seed documents. What DESIGN.md lets differ is normalized away: the
expr numbers of communications, Deallocate nodes (ours are extra), and the
predicate's `deviceIdx.x`, which DESIGN.md names `rank`.

usage: tests/seed_compare.py [SEEDS_DIR]   (default: ../shared/seeds)"""
import os, re, sys

here = os.path.dirname(os.path.abspath(__file__))
seeds = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "shared", "seeds")
if not os.path.isdir(seeds):
    print("seed_compare: no seed documents at %s; skipped" % seeds)
    sys.exit(0)

def read(name):
    for f in sorted(os.listdir(seeds)):
        if f.startswith(name):
            return open(os.path.join(seeds, f), encoding="utf-8").read()
    sys.exit("seed_compare: no seed %s* in %s" % (name, seeds))

def seed004(name):  # the dumps of seed 004 lost their line breaks
    text = read("004_")
    tag = "MultiDeviceStreamParallelTypeTest.%s " % name
    i = text.index(tag + "%HostIrContainer") + len(tag)
    return text[i:text.index("} // %HostIrContainer", i) + len("} // %HostIrContainer")]

def seed003(k):
    lines = read("003_").split("\n")
    start = [i for i, l in enumerate(lines) if l.startswith("%HostIrContainer")][k]
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("} // %HostIrContainer"))
    text = "\n".join(lines[start:end + 1])
    return re.sub(r"resets_to_zero=false\n\)", "resets_to_zero=false)", text)

def normalize(text):
    text = re.sub(r"Deallocate \{\n[^\n]*\n\s*\}\n", "", text)
    text = text.replace("( StreamIdx == deviceIdx.x )", "( StreamIdx == rank )")
    text = " ".join(text.split())
    numbers = {}
    def renumber(m):
        numbers.setdefault(m.group(2), "N%d" % len(numbers))
        return m.group(1) + numbers[m.group(2)]
    return re.sub(r"(Communication |EndCoalescing |P2PCommunication )(\d+)", renumber, text)

cases = [("Allgather", seed004("Allgather")), ("Allreduce", seed004("Allreduce")),
         ("ReduceScatter", seed004("ReduceScatter")), ("AG_matmul", seed004("AG_matmul")),
         ("AllgatherP2p", seed003(0)), ("AG_matmul_P2p", seed003(1))]
failed = 0
for name, reference in cases:
    ours = normalize(open(os.path.join(here, "golden", "seed_%s.txt" % name), encoding="utf-8").read())
    theirs = normalize(reference)
    if ours == theirs:
        print("ok   seed %s: the lowered program is nvFuser's" % name)
        continue
    failed += 1
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    print("FAIL seed %s differs:\n  ours:   ...%s\n  nvFuser: ...%s" % (name, ours[max(0, k - 100):k + 100], theirs[max(0, k - 100):k + 100]))
print("%d passed, %d failed" % (len(cases) - failed, failed))
sys.exit(1 if failed else 0)
