#!/usr/bin/env python3
"""Checks the golden dumps of the lowered seed fusions (tests/golden/seed_*.txt,
which the C tests compare with hir_lower's output) against nvFuser's own dumps
of the same tests, kept in tests/nvfuser/ as nvFuser's pull requests printed
them (NVFUSER_DUMP=host_ir): #4515 "[Stream lowering] Allgather p2p" for
AllgatherP2p and AG_matmul_P2p; the collective-based pipelines stacked on
#4401, MultiDeviceStreamParallelTypeTest, for Allgather, Allreduce,
ReduceScatter and AG_matmul (those lost their line breaks on the page; the
comparison ignores white space). What DESIGN.md lets differ
is normalized away: the expr numbers of communications, Deallocate nodes (ours
are extra), and the predicate's `deviceIdx.x`, which DESIGN.md names `rank`.

usage: tests/seed_compare.py"""
import os, re, sys

here = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) > 1:
    sys.exit(__doc__)


def normalize(text):
    text = re.sub(r"Deallocate \{\n[^\n]*\n\s*\}\n", "", text)
    text = text.replace("( StreamIdx == deviceIdx.x )", "( StreamIdx == rank )")
    text = " ".join(text.split())
    numbers = {}

    def renumber(m):
        numbers.setdefault(m.group(2), "N%d" % len(numbers))
        return m.group(1) + numbers[m.group(2)]
    return re.sub(r"(Communication |EndCoalescing |P2PCommunication )(\d+)", renumber, text)


def read(*path):
    return open(os.path.join(here, *path), encoding="utf-8").read()


cases = ["Allgather", "Allreduce", "ReduceScatter", "AG_matmul", "AllgatherP2p", "AG_matmul_P2p"]
failed = 0
for name in cases:
    ours = normalize(read("golden", "seed_%s.txt" % name))
    theirs = normalize(read("nvfuser", "%s.txt" % name))
    if ours == theirs:
        print("ok   seed %s: the lowered program is nvFuser's" % name)
        continue
    failed += 1
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    print("FAIL seed %s differs:\n  ours:   ...%s\n  nvFuser: ...%s" % (name, ours[max(0, k - 100):k + 100], theirs[max(0, k - 100):k + 100]))
print("%d passed, %d failed" % (len(cases) - failed, failed))
sys.exit(1 if failed else 0)
