#!/usr/bin/env python3
"""One table of seam against PyTorch from the CSVs of `seam bench` and compare_torch.py:
for each workload, every variant's ms/step and the speed-up of seam's best variant over
it (torch ms / seam ms; above 1 means seam is faster), and the device memory each held:
seam's model buffers, arena and step workspaces; PyTorch's peak of allocated bytes."""
import csv
import sys


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    rows = []
    for path in sys.argv[1:]:
        try:
            rows += load(path)
        except FileNotFoundError:
            print(f"(missing {path})")
    for w in sorted({r["workload"] for r in rows}):
        mine = [r for r in rows if r["workload"] == w and r["framework"] == "seam"]
        theirs = [r for r in rows if r["workload"] == w and r["framework"] == "torch"]
        if not mine:
            continue
        best = min(mine, key=lambda r: float(r["ms_per_step"]))
        b = float(best["ms_per_step"])
        print(f"\n{w}: seam best = {best['variant']} {b:.4f} ms/step")
        print(f"  {'framework':9s} {'variant':26s} {'ms/step':>10s} {'seam speed-up':>14s} {'memory MiB':>11s}")
        for r in mine + theirs:
            ms = float(r["ms_per_step"])
            mib = f"{float(r['memory_mib']):11.1f}" if r.get("memory_mib") else f"{'-':>11s}"
            print(f"  {r['framework']:9s} {r['variant']:26s} {ms:10.4f} {ms / b:13.2f}x {mib}")
        if theirs:
            best_t = min(theirs, key=lambda r: float(r["ms_per_step"]))
            print(f"  seam vs the best PyTorch variant ({best_t['variant']}, torch {best_t.get('version', '?')}): "
                  f"{float(best_t['ms_per_step']) / b:.2f}x")
        if best.get("sm_mhz"):  # the clock seam's best window ran at (empty without NVML)
            print(f"  seam's window: SM clock {float(best['sm_mhz']):.0f} MHz, {float(best['watts']):.0f} W, "
                  f"held down by the power cap in {100 * float(best['power_capped']):.0f}% of samples")
        gemm = [float(r["gemm_ms"]) for r in mine if r.get("gemm_ms") and float(r["gemm_ms"]) > 0]
        if gemm:
            print(f"  GEMMs alone: {gemm[0]:.4f} ms; the step is {b / gemm[0]:.2f}x the sum of its GEMMs")


if __name__ == "__main__":
    main()
