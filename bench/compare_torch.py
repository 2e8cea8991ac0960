#!/usr/bin/env python3
"""The workloads of `seam bench` in PyTorch, same shapes, precision and optimizer.

Variants: eager with the default (foreach) optimizer; eager with fused=True;
torch.compile with the default mode, mode="reduce-overhead" and
mode="max-autotune-no-cudagraphs"; and the whole step (forward, backward, fused
capturable optimizer step) captured by hand with torch.cuda.graph and replayed. Timed
with CUDA events after warm-up; the median of several repetitions of many steps. Data
stays on the GPU, as in `seam bench` without --upload.

--precision: tf32 (fp32 values, TF32 matmuls: seam's "tf32"), f32 (IEEE), bf16 or f16
(torch.autocast around the forward pass and the loss, fp32 parameters and optimizer,
as seam's mixed policies; f16 adds a GradScaler, which the hand-captured graph cannot
hold, so that variant is left out at f16).
"""
import contextlib
import argparse
import csv
import statistics
import sys

import torch
import torch.nn.functional as F

WORKLOADS = {
    "W1": dict(batch=128, dims=[784, 1024, 1024, 10], act="relu", opt="adam", lr=1e-3, wd=0.0),
    "W2": dict(batch=8192, dims=[4096, 4096, 4096, 4096, 1000], act="gelu_tanh", opt="adamw", lr=1e-3, wd=0.01),
    "W3": dict(batch=4096, dims=[1024, 1024, 2048, 1000], blocks=4, opt="adamw", lr=1e-3, wd=0.01),
    "W4": dict(batch=4096, dims=[1024, 1024, 4096, 1000], blocks=4, norm=True, opt="adamw", lr=1e-3, wd=0.01),
    # torchvision's resnet18(num_classes=10) on 32x32x3 inputs, channels_last, as
    # examples/resnet18_cifar.json (seam's W5).
    "W5": dict(batch=256, image=[3, 32, 32], classes=10, resnet18=True, opt="sgd", lr=0.1, momentum=0.9, wd=5e-4),
}


class Mlp(torch.nn.Module):
    def __init__(self, dims, act):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = act

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x) if self.act == "relu" else F.gelu(x, approximate="tanh")
        return x


class Residual(torch.nn.Module):
    """W3 (gated): in -> blocks of h += gamma * down(silu(gate(h)) * up(h)) -> head.
    W4 (norm): in -> blocks of h = layer_norm(h + down(gelu_tanh(up(h)))) -> head."""

    def __init__(self, dims, blocks, norm):
        super().__init__()
        d_in, width, hidden, classes = dims
        self.norm = norm
        self.inp = torch.nn.Linear(d_in, width)
        self.up = torch.nn.ModuleList(torch.nn.Linear(width, hidden) for _ in range(blocks))
        self.down = torch.nn.ModuleList(torch.nn.Linear(hidden, width) for _ in range(blocks))
        if norm:
            self.scale = torch.nn.ModuleList(torch.nn.LayerNorm(width, eps=1e-5) for _ in range(blocks))
        else:
            self.gate = torch.nn.ModuleList(torch.nn.Linear(width, hidden) for _ in range(blocks))
            self.scale = torch.nn.ParameterList(torch.nn.Parameter(torch.full((width,), 0.1)) for _ in range(blocks))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        h = self.inp(x)
        for b in range(len(self.up)):
            if self.norm:
                h = self.scale[b](h + self.down[b](F.gelu(self.up[b](h), approximate="tanh")))
            else:
                h = h + self.scale[b] * self.down[b](F.silu(self.gate[b](h)) * self.up[b](h))
        return self.head(h)


def make(spec, **opt_kwargs):
    torch.manual_seed(0)
    if spec.get("resnet18"):
        import torchvision

        model = torchvision.models.resnet18(num_classes=spec["classes"]).cuda().to(memory_format=torch.channels_last)
        opt_kwargs.pop("capturable", None)  # SGD keeps no step count: nothing to capture
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=spec["momentum"], weight_decay=spec["wd"],
                              **opt_kwargs)
        x = torch.randn(spec["batch"], *spec["image"], device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, spec["classes"], (spec["batch"],), device="cuda")
        return model, opt, x, y
    if "blocks" in spec:
        model = Residual(spec["dims"], spec["blocks"], spec.get("norm", False)).cuda()
    else:
        model = Mlp(spec["dims"], spec["act"]).cuda()
    cls = torch.optim.Adam if spec["opt"] == "adam" else torch.optim.AdamW
    kw = dict(lr=spec["lr"])
    if spec["opt"] == "adamw":
        kw["weight_decay"] = spec["wd"]
    opt = cls(model.parameters(), **kw, **opt_kwargs)
    x = torch.randn(spec["batch"], spec["dims"][0], device="cuda")
    y = torch.randint(0, spec["dims"][-1], (spec["batch"],), device="cuda")
    return model, opt, x, y


def timed(step, steps, warmup, repeats):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    per = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            step()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / steps)
    return statistics.median(per), min(per), max(per)


PRECISION = "tf32"


def autocast():
    if PRECISION in ("bf16", "f16"):
        return torch.autocast("cuda", dtype=torch.bfloat16 if PRECISION == "bf16" else torch.float16)
    return contextlib.nullcontext()


def trainer(model, opt, x, y):
    """One step: forward and loss under autocast, backward, update (scaled at f16)."""
    scaler = torch.amp.GradScaler("cuda") if PRECISION == "f16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step


def variant_eager(spec, fused):
    model, opt, x, y = make(spec, fused=True) if fused else make(spec, foreach=True)
    return trainer(model, opt, x, y)


def variant_compile(spec, mode):
    model, opt, x, y = make(spec, fused=True)
    return trainer(torch.compile(model, mode=mode), opt, x, y)


def variant_graph(spec):
    if PRECISION == "f16":
        raise RuntimeError("GradScaler reads its overflow flag on the host: no whole-step graph at f16")
    model, opt, x, y = make(spec, fused=True, capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        with autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return g.replay


VARIANTS = {
    "eager_foreach": lambda s: variant_eager(s, fused=False),
    "eager_fused": lambda s: variant_eager(s, fused=True),
    "compile_default": lambda s: variant_compile(s, "default"),
    "compile_reduce_overhead": lambda s: variant_compile(s, "reduce-overhead"),
    "compile_max_autotune_no_cudagraphs": lambda s: variant_compile(s, "max-autotune-no-cudagraphs"),
    "cuda_graph_whole_step": variant_graph,
}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    # As seam bench: W1-W4 unless named (W5, a ResNet-18, by name).
    p.add_argument("workloads", nargs="*", default=["W1", "W2", "W3", "W4"])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    # seam bench's defaults: the same number of steps on both sides, so that both are timed
    # in the same power state (a long run of large GEMMs reaches the board's power cap and
    # the clocks drop; a short window would time the unthrottled start).
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--csv", default="")
    p.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], default="tf32")
    a = p.parse_args()
    global PRECISION
    PRECISION = a.precision
    # TF32 only where asked: at f32 as IEEE fp32; bf16 and f16 matmuls are autocast's.
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
    rows = []
    for w in a.workloads:
        spec = WORKLOADS[w]
        for v in a.variants:
            try:
                ms, lo, hi = timed(VARIANTS[v](spec), a.steps, a.warmup, a.repeats)
            except Exception as e:  # a variant that fails is reported, the others still run
                print(f"{w} {v}: failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            print(f"{w} {v:26s} {ms:9.4f} ms/step ({lo:.4f}-{hi:.4f})  {spec['batch'] / ms * 1e3:12.0f} samples/s",
                  flush=True)
            rows.append(dict(framework="torch", workload=w, variant=v, device="cuda", ms_per_step=ms, ms_min=lo,
                             ms_max=hi, samples_per_s=spec["batch"] / ms * 1e3, version=torch.__version__,
                             precision=a.precision))
            torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            out.writeheader()
            out.writerows(rows)


if __name__ == "__main__":
    main()
