"""PyTorch's side of the attention benchmark (docs/perf.md): scaled-dot-product attention
alone, forward and backward, at W6's shape by default ([16, 12, 1024, 64], causal, bf16),
with each SDPA backend in turn. seam's side is `seam bench W6 --breakdown`, whose
attention and attention_grad steps run the same shape.

    python bench/attention_torch.py [--shape B H T D] [--dtype bf16|f16] [--full]
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from compare_torch import timed  # median ms of `repeats` runs of `steps` steps

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "memory_efficient": SDPBackend.EFFICIENT_ATTENTION}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", type=int, nargs=4, default=[16, 12, 1024, 64], metavar=("B", "H", "T", "D"))
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--full", action="store_true", help="no causal mask")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    b, h, t, d = a.shape
    causal = not a.full
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=g)
    flops = 4 * b * h * t * t * d * (0.5 if causal else 1.0) * 3.5  # forward 2 products, backward 5
    print(f"attention alone, forward + backward, [{b}, {h}, {t}, {d}] {a.dtype}{' causal' if causal else ''}, "
          f"torch {torch.__version__}")
    for name, backend in BACKENDS.items():
        def step():
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.autograd.grad(o, (q, k, v), dout)  # no accumulation into .grad
        try:
            ms = timed(step, steps=50, warmup=5, repeats=5)[0]
        except RuntimeError as e:
            print(f"  {name:18s} unavailable: {str(e).splitlines()[0]}")
            continue
        print(f"  {name:18s} {ms:8.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
