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
hold, so that variant is left out at f16). Without it, W1-W5 run in tf32 and a model file
in its own "precision" (seam bench takes W5's from its file too: give --precision bf16 to
time the same).

A model file is a workload too (`compare_torch.py W5 examples/fmnist_cnn.json`): its
PyTorch twin (bench/twin/: the file's layers and nodes, optimizer and loss), at
the file's batch size, channels-last where it has convolutions, on random data like the
others, named as seam bench names it (the file's "name"). --check-first-step SEAM runs
`seam step` and the same step on the twin for every model-file workload (W5: its model
file, examples/resnet18_cifar.json) before the timing, and reports whether the loss,
logits, gradients and update agree (twin.check_step); the exit status is 1 if one
does not.

W6 is GPT-2 124M (`Gpt` below, nanoGPT's and llm.c's formulation, its parameters named
as seam's so that seam's tensors load into it; tests/python checks it against `seam step`)
with bf16 autocast, fused AdamW, clipping at 1.0 and cuDNN's attention; the variant
eager_fused_flash_sdpa takes the flash backend instead (no other workload has attention).

W5's torchvision ResNet-18 decays only what seam decays (conv and linear weights, never
biases or batch-norm parameters: twin.module_param_groups), so that the optimizer step
timed here is the one seam and the twin run.
"""
import contextlib
import argparse
import csv
import gc
import os
import math
import statistics
import sys

import torch
import torch.nn.functional as F

import twin

WORKLOADS = {
    "W1": dict(batch=128, dims=[784, 1024, 1024, 10], act="relu", opt="adam", lr=1e-3, wd=0.0),
    "W2": dict(batch=8192, dims=[4096, 4096, 4096, 4096, 1000], act="gelu_tanh", opt="adamw", lr=1e-3, wd=0.01),
    "W3": dict(batch=4096, dims=[1024, 1024, 2048, 1000], blocks=4, opt="adamw", lr=1e-3, wd=0.01),
    "W4": dict(batch=4096, dims=[1024, 1024, 4096, 1000], blocks=4, norm=True, opt="adamw", lr=1e-3, wd=0.01),
    # torchvision's resnet18(num_classes=10) on 32x32x3 inputs, channels_last, as
    # examples/resnet18_cifar.json (seam's W5).
    "W5": dict(batch=256, image=[3, 32, 32], classes=10, resnet18=True, opt="sgd", lr=0.1, momentum=0.9, wd=5e-4),
    # GPT-2 124M as examples/gpt2_124m.json (seam's W6): bf16 autocast, AdamW (0.9, 0.95)
    # with decay on the 2-D weights, global-norm clipping, cuDNN's attention unless a
    # variant names another backend.
    "W6": dict(batch=16, gpt=dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, padded_vocab=50304, block_size=1024),
               opt="adamw", lr=6e-4, betas=(0.9, 0.95), wd=0.1, clip=1.0, precision="bf16", sdpa="cudnn"),
}
# The built-in workloads that are model files in seam (bench's W5 is this file, built in).
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
MODEL_FILES = {"W5": os.path.join(EXAMPLES, "resnet18_cifar.json"), "W6": os.path.join(EXAMPLES, "gpt2_124m.json")}


def model_file_spec(path):
    """A model file as a workload: its twin, batch size, precision and loss."""
    m = twin.load_model(path)
    return dict(batch=m.batch_size, model_file=path, name=m.name, precision=m.precision,
                label_smoothing=m.label_smoothing)


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


class Gpt(torch.nn.Module):
    """GPT-2 as nanoGPT and llm.c write it, named as seam's nn::gpt names its parameters
    (so seam's tensors load into it): pre-norm blocks of causal attention through
    F.scaled_dot_product_attention and a GELU (tanh) MLP, the output projection tied to
    wte, a padded vocabulary cut off the logits."""

    def __init__(self, n_layer, n_head, n_embd, vocab, block_size, padded_vocab=0):
        super().__init__()
        rows = padded_vocab or vocab
        self.n_head, self.vocab = n_head, vocab
        self.wte = torch.nn.Embedding(rows, n_embd)
        self.wpe = torch.nn.Embedding(block_size, n_embd)
        self.h = torch.nn.ModuleList(Block(n_embd) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():  # GPT-2's initialization
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif not name.endswith("ln_1.weight") and not name.endswith("ln_2.weight") and name != "ln_f.weight":
                torch.nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx.long()) + self.wpe.weight[:t]
        for block in self.h:
            x = block(x, self.n_head)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return logits[..., : self.vocab]


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.attn = torch.nn.Module()
        self.attn.c_attn, self.attn.c_proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.mlp = torch.nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x, n_head):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


def make(spec, **opt_kwargs):
    torch.manual_seed(0)
    if spec.get("model_file"):
        model = twin.Twin(spec["model_file"], precision=PRECISION).cuda()
        if model.has_conv:
            model = model.to(memory_format=torch.channels_last)
        opt, _ = twin.make_optimizer(model, **opt_kwargs)  # SGD drops capturable, as W5's
        if model.model_file.input_dtype == "i32":  # token ids, and a label per position
            x = torch.randint(0, model.classes, (spec["batch"], *model.input_shape), device="cuda", dtype=torch.int32)
            y = torch.randint(0, model.classes, tuple(x.shape), device="cuda")
            return model, opt, x, y
        x = torch.randn(spec["batch"], *model.input_shape, device="cuda")
        if model.has_conv and x.dim() == 4:
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, model.classes, (spec["batch"],), device="cuda")
        return model, opt, x, y
    if spec.get("gpt"):
        g = spec["gpt"]
        model = Gpt(**g).cuda()
        opt = torch.optim.AdamW(twin.module_param_groups(model, spec["wd"]), lr=spec["lr"], betas=spec["betas"],
                                **opt_kwargs)
        x = torch.randint(0, g["vocab"], (spec["batch"], g["block_size"]), device="cuda", dtype=torch.int32)
        y = torch.randint(0, g["vocab"], (spec["batch"], g["block_size"]), device="cuda")
        return model, opt, x, y
    if spec.get("resnet18"):
        import torchvision

        model = torchvision.models.resnet18(num_classes=spec["classes"]).cuda().to(memory_format=torch.channels_last)
        opt_kwargs.pop("capturable", None)  # SGD keeps no step count: nothing to capture
        opt = torch.optim.SGD(twin.module_param_groups(model, spec["wd"]), lr=spec["lr"], momentum=spec["momentum"],
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


def loss_of(model, x, y, label_smoothing=0.0):
    """The mean cross entropy over every label (one a sample, or one a position)."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), label_smoothing=label_smoothing)


def sdpa_backend(spec):
    """The attention backend a spec asks for, as a context (none for workloads without attention)."""
    name = spec.get("sdpa")
    if not name:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION}[name])


def trainer(model, opt, x, y, spec, loss_fn=None):
    """One step: forward and loss under autocast (loss_fn(x, y), by default loss_of the
    model), backward, gradients clipped to the spec's global norm (unscaled first at f16),
    update (scaled at f16)."""
    scaler = torch.amp.GradScaler("cuda") if PRECISION == "f16" else None
    ls, clip = spec.get("label_smoothing", 0.0), spec.get("clip")
    if loss_fn is None:
        loss_fn = lambda a, b: loss_of(model, a, b, ls)  # noqa: E731

    def step():
        opt.zero_grad(set_to_none=True)
        with sdpa_backend(spec):
            with autocast():
                loss = loss_fn(x, y)
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    return step


def variant_eager(spec, fused):
    model, opt, x, y = make(spec, fused=True) if fused else make(spec, foreach=True)
    return trainer(model, opt, x, y, spec)


def variant_compile(spec, mode):
    """The model and its loss compiled as one function, as nanoGPT and llm.c's PyTorch
    script compute the loss inside the compiled forward: the cross entropy then fuses with
    the logits' slice and cast (compiling the model alone left the loss eager: the sliced
    logits copied and cast to fp32, 3.3 GB more a step at W6)."""
    model, opt, x, y = make(spec, fused=True)
    ls = spec.get("label_smoothing", 0.0)
    return trainer(model, opt, x, y, spec, loss_fn=torch.compile(lambda a, b: loss_of(model, a, b, ls), mode=mode))


def variant_sdpa(spec, backend):
    """Eager, fused optimizer, with another attention backend (W6's default is cuDNN's)."""
    if not spec.get("sdpa"):
        raise RuntimeError("no attention in this workload")
    return variant_eager(dict(spec, sdpa=backend), fused=True)


def variant_graph(spec):
    if PRECISION == "f16":
        raise RuntimeError("GradScaler reads its overflow flag on the host: no whole-step graph at f16")
    model, opt, x, y = make(spec, fused=True, capturable=True)
    step = trainer(model, opt, x, y, spec)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g.replay


VARIANTS = {
    "eager_foreach": lambda s: variant_eager(s, fused=False),
    "eager_fused": lambda s: variant_eager(s, fused=True),
    "compile_default": lambda s: variant_compile(s, "default"),
    "compile_reduce_overhead": lambda s: variant_compile(s, "reduce-overhead"),
    "compile_max_autotune_no_cudagraphs": lambda s: variant_compile(s, "max-autotune-no-cudagraphs"),
    "cuda_graph_whole_step": variant_graph,
    "eager_fused_flash_sdpa": lambda s: variant_sdpa(s, "flash"),
}


def profile(step, steps, title, rows=40):
    """The GPU kernels of `steps` steps, each kernel name's time a step, largest first: where
    the time goes, to set beside `seam bench --breakdown`."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = e.self_cuda_time_total
        if us > 0:
            kernels.append((us / steps, e.count / steps, e.key))
    kernels.sort(reverse=True)
    total = sum(k[0] for k in kernels)
    print(f"### profile {title}: {total / 1e3:.4f} ms of GPU time a step, {sum(k[1] for k in kernels):.0f} kernels")
    for us, n, key in kernels[:rows]:
        print(f"  {us:9.1f} us {n:5.1f}x  {key[:140]}")
    print(f"  ({max(0, len(kernels) - rows)} more names)", flush=True)


def check_first_steps(names, specs, a):
    """twin.check_step for every workload that is a model file; returns whether all pass."""
    ok = True
    for w in names:
        spec = specs[w]
        path = spec.get("model_file") or MODEL_FILES.get(w)
        if not path:
            print(f"{w}: first step not checked: a built-in workload of seam bench, not a model file", flush=True)
            continue
        precision = a.precision or spec.get("precision", "tf32")
        try:
            r = twin.check_step(a.check_first_step, path, precision, a.check_device,
                                a.check_batch or spec["batch"])
            ok = ok and r.ok
        except Exception as e:  # reported; the timing still runs
            print(f"{w}: first-step check failed to run: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            ok = False
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # As seam bench: W1-W4 unless named (W5, a ResNet-18, and W6, GPT-2, by name), and model files.
    p.add_argument("workloads", nargs="*", default=["W1", "W2", "W3", "W4"])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    # seam bench's defaults: the same number of steps on both sides, so that both are timed
    # in the same power state (a long run of large GEMMs reaches the board's power cap and
    # the clocks drop; a short window would time the unthrottled start).
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--csv", default="")
    p.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], default=None,
                   help="default: tf32 for W1-W5, bf16 for W6, a model file's own precision")
    p.add_argument("--check-first-step", metavar="SEAM_BINARY", default=None,
                   help="before timing, check seam's first training step against the twin of every model-file "
                        "workload (and W5's model file)")
    p.add_argument("--check-device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--check-batch", type=int, default=None, help="default: the workload's batch")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after timing a variant, its GPU kernels over this many steps, by time (torch.profiler)")
    a = p.parse_args()
    specs = {}
    for w in a.workloads:
        if w in WORKLOADS:
            specs[w] = WORKLOADS[w]
        elif w.endswith(".json") or os.path.exists(w):
            specs[w] = model_file_spec(w)
        else:
            p.error(f"no workload named {w} (known: {', '.join(WORKLOADS)}, or a model file)")
    checked = True
    if a.check_first_step:
        checked = check_first_steps(a.workloads, specs, a)
    global PRECISION
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
    rows = []
    for w in a.workloads:
        spec = specs[w]
        name = spec.get("name", w)
        PRECISION = a.precision or spec.get("precision", "tf32")
        # TF32 only where asked: at f32 as IEEE fp32; bf16 and f16 matmuls are autocast's.
        torch.backends.cuda.matmul.allow_tf32 = PRECISION == "tf32"
        torch.backends.cudnn.allow_tf32 = PRECISION == "tf32"
        for v in a.variants:
            # Peak memory of this variant alone: what its tensors, graphs and workspaces
            # held at most (the caching allocator's peak of allocated bytes).
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            try:
                step = VARIANTS[v](spec)
                ms, lo, hi = timed(step, a.steps, a.warmup, a.repeats)
                if a.profile:
                    profile(step, a.profile, f"{name} {v}")
            except Exception as e:  # a variant that fails is reported, the others still run
                print(f"{name} {v}: failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            mib = torch.cuda.max_memory_allocated() / 2**20
            print(f"{name} {v:26s} {ms:9.4f} ms/step ({lo:.4f}-{hi:.4f})  {spec['batch'] / ms * 1e3:12.0f} samples/s"
                  f"  peak {mib:8.1f} MiB", flush=True)
            rows.append(dict(framework="torch", workload=name, variant=v, device="cuda", ms_per_step=ms, ms_min=lo,
                             ms_max=hi, samples_per_s=spec["batch"] / ms * 1e3, version=torch.__version__,
                             precision=PRECISION, memory_mib=mib))
    if a.csv and rows:
        with open(a.csv, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            out.writeheader()
            out.writerows(rows)
    if not checked:
        print("first-step check: MISMATCH (see above)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
