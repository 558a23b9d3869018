#!/usr/bin/env python3
"""Checks that README.md and docs/GUIDE.md say what is true: every ```c block compiles (-Werror,
C11); a complete program (one with main) that needs no GPU is built, run,
and its output compared with the ``` block after "prints" where there is one
(sorted, where the text says the order varies); the GPU blocks and the
build commands of the GPU section are compiled and linked where CUDA is
found (CUDA_HOME, else nvcc on PATH). Used by CI.

usage: tools/check_readme.py"""
import os, re, shutil, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if len(sys.argv) > 1:
    sys.exit(__doc__)
docs = [(name, open(os.path.join(root, name), encoding="utf-8").read()) for name in ("README.md", "docs/GUIDE.md")]
nvcc = shutil.which("nvcc")
cuda = os.environ.get("CUDA_HOME") or (os.path.dirname(os.path.dirname(nvcc)) if nvcc else None)
tmp = tempfile.mkdtemp()
failed = checked = 0


def run(cmd, what):
    global failed
    r = subprocess.run(cmd, shell=True, cwd=tmp, capture_output=True, text=True)
    if r.returncode:
        failed += 1
        print("FAIL %s:\n  %s\n%s%s" % (what, cmd, r.stdout[-2000:], r.stderr[-2000:]))
        return None
    return r.stdout


strict = "-std=c11 -Wall -Wextra -Wpedantic -Werror -I" + root
for name, text in docs:
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]
    for k, (lang, code, at, end) in enumerate(blocks):
        if lang != "c":
            continue
        line = text.count("\n", 0, at) + 1
        what = "%s:%d" % (name, line)
        gpu = "hir_nccl" in code or "HOSTIR_CUDA" in code
        src = os.path.join(tmp, "b%d.c" % k)
        if gpu and not cuda:
            print("skip %s (a GPU block; no CUDA here)" % what)
            continue
        checked += 1
        complete = "int main(" in code
        prelude = "" if complete or "#include" in code else (
            '#define HOSTIR_CUDA\n#define HOSTIR_IMPLEMENTATION\n#define HOSTIR_NCCL_IMPLEMENTATION\n#include "hostir_nccl.h"\n' if gpu
            else '#define HOSTIR_IMPLEMENTATION\n#include "hostir.h"\n')
        open(src, "w").write(prelude + code)
        if gpu:
            flags = "-D_POSIX_C_SOURCE=200809L -Wno-unused-function -I%s/include" % cuda
            if run("cc %s %s -c %s -o b%d.o" % (strict, flags, src, k), what) is not None:
                print("ok   %s compiles" % what)
            continue
        if not complete:
            if run("cc %s -Wno-unused-function -c %s -o b%d.o" % (strict, src, k), what) is not None:
                print("ok   %s compiles" % what)
            continue
        out = run("cc %s %s -o b%d -lm -lpthread && ./b%d" % (strict, src, k, k), what)
        if out is None:
            continue
        after = text[end:]  # the text after this block
        m = re.match(r"\s*\n(prints[^\n]*)\n\n```\n(.*?)```", after, re.S)
        if not m:
            print("ok   %s compiles and runs" % what)
            continue
        want, got = m.group(2), out
        if "some order" in m.group(1):
            want, got = sorted(want.splitlines()), sorted(got.splitlines())
        if want != got:
            failed += 1
            print("FAIL %s prints something else:\n%s\n  the text shows:\n%s" % (what, out, m.group(2)))
        else:
            print("ok   %s compiles, runs and prints what the text shows" % what)

text = docs[0][1]
blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]
if cuda:  # the GPU section's build commands, on its include block and an empty main
    gpu_block = next(code for lang, code, _, _ in blocks if lang == "c" and "#define HOSTIR_NCCL_IMPLEMENTATION" in code)
    open(os.path.join(tmp, "app.c"), "w").write(gpu_block + "int main(void) { return 0; }\n")
    for h in ("hostir.h", "hostir_nccl.h"):  # vendored beside app.c, as the README has it
        shutil.copy(os.path.join(root, h), tmp)
    sh = next(code for lang, code, _, _ in blocks if lang == "sh" and "-lnccl" in code)
    for cmd in sh.replace("\\\n", " ").splitlines():
        cmd = cmd.split("#")[0].strip()
        if not cmd or "pkg-config" in cmd:
            continue  # pkg-config: CI checks it after make install
        checked += 1
        cmd = cmd.replace("$CUDA_HOME", cuda).replace("app.c", "app.c -o app")
        if run(cmd, "README.md's GPU build command") is not None:
            print("ok   builds: %s" % cmd[:100])
shutil.rmtree(tmp)
print("%d checked, %d failed" % (checked, failed))
sys.exit(1 if failed else 0)
