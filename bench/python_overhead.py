"""What a step costs from Python over the same step from C++: one program, run n times from
a Python loop (`program.run()`) and n times from C++ (`program._run_many(n)`, the loop
inside the module), each followed by `check()`, so the difference per run is the
binding's cost: the call, its argument conversion and the GIL released and taken again.

  python bench/python_overhead.py [--device cpu|cuda] [--workload tiny|W1] [--runs N]

`tiny` is one 16-wide linear layer's training step (on the CPU its work is a few
microseconds, so the call is a large share); W1 is `seam bench`'s W1 (the 784-1024-1024-10
MLP at batch 128, Adam at 1e-3; TF32 on the GPU). Prints the median of several rounds of each loop.
"""
import argparse
import statistics
import time

import numpy as np

import seam


def tiny(device):
    g = seam.Graph()
    x, y = g.input("x", [4, 16]), g.input("y", [4], "i32")
    loss = seam.cross_entropy(seam.nn.linear(x, 16, "fc"), y)
    step = seam.Model(g, seed=1, device=device).compile(loss=loss, optimizer=seam.SGD(lr=0.01))
    rng = np.random.default_rng(0)
    step.set_input("x", rng.standard_normal((4, 16)).astype(np.float32))
    step.set_input("y", rng.integers(0, 16, 4).astype(np.int32))
    return step


def w1(device):
    batch = 128
    g = seam.Graph()
    x, y = g.input("x", [batch, 784]), g.input("y", [batch], "i32")
    h = seam.relu(seam.nn.linear(x, 1024, "fc1"))
    h = seam.relu(seam.nn.linear(h, 1024, "fc2"))
    loss = seam.cross_entropy(seam.nn.linear(h, 10, "fc3"), y)
    precision = "tf32" if device == "cuda" else "f32"
    step = seam.Model(g, seed=1, device=device, precision=precision).compile(loss=loss, optimizer=seam.Adam(lr=1e-3))
    rng = np.random.default_rng(0)
    step.set_input("x", rng.standard_normal((batch, 784)).astype(np.float32))
    step.set_input("y", rng.integers(0, 10, batch).astype(np.int32))
    return step


def python_loop(step, n):
    start = time.perf_counter()
    for _ in range(n):
        step.run()
    step.check()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--workload", default="tiny", choices=["tiny", "W1"])
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    step = (tiny if a.workload == "tiny" else w1)(a.device)
    python_loop(step, max(a.runs // 10, 10))  # warm up: the first run captures the graph, caches fill
    step._run_many(max(a.runs // 10, 10))
    py, cc = [], []
    for _ in range(a.rounds):  # interleaved, so that drift of the machine falls on both
        py.append(python_loop(step, a.runs) / a.runs * 1e6)
        cc.append(step._run_many(a.runs) / a.runs * 1e6)
    mp, mc = statistics.median(py), statistics.median(cc)
    print(f"{a.workload} on {a.device}, {a.runs} runs x {a.rounds} rounds (median us per run):")
    print(f"  from Python {mp:9.2f}  (min {min(py):.2f}, max {max(py):.2f})")
    print(f"  from C++    {mc:9.2f}  (min {min(cc):.2f}, max {max(cc):.2f})")
    print(f"  overhead    {mp - mc:9.2f} us per run")


if __name__ == "__main__":
    main()
