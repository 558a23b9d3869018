# A suspect of the tuner's misses, tested on one GPU: are GEMMs right after ~1-3 s of
# back-to-back GEMMs slower than after a pause (the SM clock and power the
# load leaves)? 20 GEMMs of 16384x8192x7168 bf16, each timed by CUDA events,
# after each (load, pause) pair; nvidia-smi's clock, power, temperature and
# throttle reasons after the load, as the timed GEMMs start, and after them.
# bench/NOTES.md section 20 has what it showed:
#   python3 bench/gemm_after_load.py
import statistics, subprocess, time, torch
a = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn(8192, 7168, device="cuda", dtype=torch.bfloat16)
def smi():
    return subprocess.check_output(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                                    "--format=csv,noheader"]).decode().strip()
def timed(n):
    out = []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); torch.mm(a, b); e1.record(); torch.cuda.synchronize(); out.append(e0.elapsed_time(e1))
    return out
timed(3)
for load_s, pause in ((1, 0), (1, 3), (1, 0), (1, 3), (3, 0), (3, 3), (0, 3)):
    t_end = time.time() + load_s
    while time.time() < t_end:
        for _ in range(10): torch.mm(a, b)
        torch.cuda.synchronize()
    before = smi()
    time.sleep(pause)
    at = smi()
    t = timed(20)
    print(f"load {load_s} s, pause {pause} s: first 5 median {statistics.median(t[:5]):.3f} ms, all 20 {statistics.median(t):.3f} "
          f"(min {min(t):.3f}) | after load: {before} | at start: {at} | after: {smi()}", flush=True)
