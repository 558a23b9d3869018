"""PyTorch's times of bench/ops.c's ops, same shapes and dtypes, on GPU 0,
taken as bench-ops takes hostir's (wall clock of the call and a synchronize,
medians of 20 after 3 warmups), printed as "key ms" lines for bench-ops --torch."""
import sys
import time

import torch


def median_ms(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[iters // 2]


def main():
    dev = torch.device("cuda", 0)
    n = 1 << 26
    x, y = torch.rand(n, device=dev, dtype=torch.bfloat16), torch.rand(n, device=dev, dtype=torch.bfloat16)
    h1, h2 = x.half(), y.half()
    f32 = torch.rand(n, device=dev)
    t = torch.rand(8192, 8192, device=dev, dtype=torch.bfloat16)
    bias_row = torch.rand(8192, device=dev, dtype=torch.bfloat16)
    ln = torch.rand(16384, 4096, device=dev, dtype=torch.bfloat16)
    w, b = torch.rand(4096, device=dev, dtype=torch.bfloat16), torch.rand(4096, device=dev, dtype=torch.bfloat16)
    a, wt, bias = (torch.rand(8192, 4096, device=dev, dtype=torch.bfloat16), torch.rand(4096, 4096, device=dev, dtype=torch.bfloat16),
                   torch.rand(4096, device=dev, dtype=torch.bfloat16))
    a8, w8 = a.to(torch.float8_e4m3fn), wt.to(torch.float8_e4m3fn)  # w8.t(): the column-major B _scaled_mm takes
    one = torch.ones((), device=dev)
    rows, cols = torch.rand(8192, 1, device=dev) + 0.5, torch.rand(1, 4096, device=dev) + 0.5
    cases = {
        "add": lambda: x + y,
        "add_row": lambda: t + bias_row,
        "relu": lambda: torch.relu(x),
        "mul_f16": lambda: h1 * h2,
        "cast": lambda: f32.to(torch.bfloat16),
        "transpose": lambda: t.t().contiguous(),
        "layer_norm": lambda: torch.nn.functional.layer_norm(ln, (4096,), w, b, 1e-5),
        "linear": lambda: torch.nn.functional.linear(a, wt, bias),
        "linear_gelu": lambda: torch.nn.functional.gelu(torch.nn.functional.linear(a, wt, bias), approximate="tanh"),
        "matmul": lambda: torch.nn.functional.linear(a, wt),
        "scaled": lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        "scaled_rows": lambda: torch._scaled_mm(a8, w8.t(), scale_a=rows, scale_b=cols, out_dtype=torch.bfloat16),
    }
    for key, fn in cases.items():
        print("%s %.4f" % (key, median_ms(fn)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
