"""PyTorch peer for `cargo xtask bench`: reads one JSON request per line on stdin and
answers one JSON line on stdout, so that redco and torch are measured in the same run,
interleaved, with the same thread count."""
import argparse
import json
import sys
import time

import torch


def gemm(req):
    m, n, k, reps = req["m"], req["n"], req["k"], req["reps"]
    g = torch.Generator().manual_seed(0)
    a = torch.rand((m, k), generator=g, dtype=torch.float32)
    b = torch.rand((k, n), generator=g, dtype=torch.float32)
    torch.matmul(a, b)  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t)
    return {"times": times}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "quit":
                return
            if op == "info":
                out = {
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "mkl": torch.backends.mkl.is_available(),
                    "mkldnn": torch.backends.mkldnn.is_available(),
                }
            elif op == "gemm":
                out = gemm(req)
            else:
                out = {"error": f"unknown op {op}"}
        except Exception as e:  # report, keep serving
            out = {"error": repr(e)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
