#!/usr/bin/env python3
"""Real exported models through seam's ONNX importer, against PyTorch and onnxruntime.

For each model (torchvision resnet18, mobilenet_v3_small, vit_b_16, and a 2-layer
GPT-style transformer, all with random weights):
  1. export to ONNX with a dynamic batch axis;
  2. run batch 64 in seam (`seam run`), PyTorch and onnxruntime, all at strict f32, and
     report the largest difference relative to the largest output;
  3. train 20 steps in seam (`seam train model.onnx --config`) on random arrays and check
     that the loss falls;
  4. time inference at batch 1 and 64 (f32 and tf32): seam's replayed plan, PyTorch eager
     and PyTorch's captured CUDA graph, onnxruntime's CUDA provider with the inputs and
     outputs bound on the device.

    onnx_models.py SEAM_BINARY OUT_DIR [--models resnet18 ...] [--device cuda] [--work DIR]
Writes OUT_DIR/onnx_models.md (the tables) and OUT_DIR/onnx_models.json.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, T):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        shape = (B, T, self.heads, C // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    """A GPT-style language model: token and position embeddings, pre-norm blocks of
    causal attention and a GELU MLP, the output projection tied to the token embedding."""

    def __init__(self, vocab=512, T=128, d=256, heads=4, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, heads, T) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("pos", torch.arange(T))

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(self.pos[: ids.shape[1]])
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def build(name):
    import torchvision

    torch.manual_seed(0)
    if name == "gpt2layer":
        return Gpt(), (128,), "ids"
    m = getattr(torchvision.models, name)(weights=None, num_classes=10)
    # A zero-initialized classifier (vit_b_16's) makes every output 0: nothing to compare.
    for mod in m.modules():
        if isinstance(mod, nn.Linear) and not mod.weight.any():
            nn.init.normal_(mod.weight, std=0.02)
    return m, (3, 224, 224), "image"


def sample(kind, shape, n, seed):
    g = np.random.default_rng(seed)
    if kind == "ids":
        return g.integers(0, 512, size=(n, *shape)).astype(np.int64)
    return g.standard_normal((n, *shape)).astype(np.float32)


EXPORTER = "torchscript"  # --exporter


def export(model, x, path):
    args = dict(input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    try:
        if EXPORTER == "dynamo":
            raise RuntimeError("the dynamo exporter asked for")
        torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False, **args)
        return "torch.onnx.export (TorchScript), opset 17"
    except Exception as e:  # noqa: BLE001 - the dynamo exporter is the fallback
        print(f"  TorchScript export: {e}; the dynamo exporter", flush=True)
        torch.onnx.export(model, (x,), path, opset_version=18, dynamo=True,
                          dynamic_shapes={"x": {0: torch.export.Dim("N", min=1, max=1024)}}, input_names=["x"],
                          output_names=["y"])
        return "torch.onnx.export (dynamo), opset 18"


def strict(tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def time_cuda(fn, runs):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e3 / runs)
    return sorted(rounds)[2]


def torch_times(model, x, runs):
    xd = torch.from_numpy(x).cuda()
    with torch.inference_mode():
        eager = time_cuda(lambda: model(xd), runs)
    static = xd.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.inference_mode():
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        model(static)
    return eager, time_cuda(graph.replay, runs)


def ort_session(path, tf32, cpu_ok=False):
    """onnxruntime's CUDA provider; None where its build has none (its CPU provider then,
    when cpu_ok: for agreement, not times)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"]) if cpu_ok else None
    opts = {"device_id": 0, "use_tf32": int(tf32), "cudnn_conv_algo_search": "EXHAUSTIVE"}
    return ort.InferenceSession(path, providers=[("CUDAExecutionProvider", opts)])


def ort_run(sess, x):
    return sess.run(None, {"x": x})[0]


def ort_time(sess, x, runs):
    import onnxruntime as ort

    binding = sess.io_binding()
    xv = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    binding.bind_ortvalue_input("x", xv)
    binding.bind_output("y", "cuda")
    sess.run_with_iobinding(binding)  # the output's buffer, allocated once
    yv = binding.get_outputs()[0]
    binding.bind_ortvalue_output("y", yv)

    def run():
        sess.run_with_iobinding(binding)

    for _ in range(3):
        run()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(runs):
            run()
        binding.synchronize_outputs()
        rounds.append((time.perf_counter() - t0) * 1e3 / runs)
    return sorted(rounds)[2]


def seam(binary, args, timeout=400):
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"seam {' '.join(args[:2])}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def seam_time(out):
    for line in out.splitlines():
        if line.startswith("time: "):
            return float(line.split()[1])
    raise RuntimeError("seam run --time printed no time")


def rel_diff(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))) / max(np.max(np.abs(b)), 1e-30))


def torch_losses(model, x, y, steps, lr):
    """The same steps in PyTorch: SGD with momentum on the whole batch, the model as
    exported (eval mode)."""
    strict(False)
    model = model.cuda().eval()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    xd, yd = torch.from_numpy(x).cuda(), torch.from_numpy(y.astype(np.int64)).cuda()
    losses = []
    for _ in range(steps):
        logits = model(xd)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yd.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def untie_like_export(model, path):
    """The exporter may write a tied weight twice (one copy folded into a transposed
    initializer): then the ONNX model trains two tables, and so does the reference."""
    import onnx

    if not isinstance(model, Gpt):
        return None
    g = onnx.load(path).graph
    uses = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    table = [t.name for t in g.initializer if list(t.dims) == list(model.wte.weight.shape)]
    tied = bool(table) and uses.get(table[0], 0) > 1
    if not tied:
        model.head.weight = nn.Parameter(model.wte.weight.detach().clone())
    return tied


def train_check(binary, model, path, kind, shape, work, device):
    """20 steps of seam train on one batch of 16 random samples (f32, SGD with momentum:
    an update linear in the gradient, so a wrong gradient shows, where Adam's
    normalization would blur it): the loss must fall, and follow PyTorch's over the same
    steps (the batch's order differs, its mean does not)."""
    x = sample(kind, shape, 16, 5)
    if kind == "ids":
        y = np.roll(x, -1, axis=1).astype(np.int32)  # next token
    else:
        y = np.random.default_rng(6).integers(0, 10, size=16).astype(np.int32)
    lr = 0.1 if kind == "ids" else 0.01
    np.save(os.path.join(work, "train_x.npy"), x)
    np.save(os.path.join(work, "train_y.npy"), y)
    cfg = {"batch_size": 16, "epochs": 20, "seed": 1, "precision": "f32", "optimizer": {"type": "sgd", "lr": lr, "momentum": 0.9},
           "data": {"arrays": {"x": "train_x.npy", "y": "train_y.npy", "test_x": "train_x.npy",
                               "test_y": "train_y.npy"}}}
    with open(os.path.join(work, "train.json"), "w") as f:
        json.dump(cfg, f)
    t0 = time.perf_counter()
    out = seam(binary, ["train", path, "--config", os.path.join(work, "train.json"), "--device", device, "--json",
                        "--log-every", "1", "--max-steps", "20", "--out", os.path.join(work, "run")], timeout=500)
    seconds = time.perf_counter() - t0
    losses = [json.loads(l)["loss"] for l in out.splitlines() if l.startswith("{") and '"event":"step"' in l]
    if len(losses) < 20:
        raise RuntimeError(f"seam train logged {len(losses)} steps, not 20: {out[-1000:]}")
    tied = untie_like_export(model, path)
    ref = torch_losses(model, x, y, len(losses), lr)
    return {"steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1], "falls": losses[-1] < losses[0],
            "torch_first": ref[0], "torch_last": ref[-1],
            "max_rel_diff_vs_torch": max(abs(a - b) for a, b in zip(losses, ref)) / ref[0], "seconds": seconds,
            "losses": losses, "torch_losses": ref, "tied_in_export": tied}


def one_model(name, binary, work_dir, out_dir, device, a):
    work = os.path.join(work_dir, name)
    os.makedirs(work, exist_ok=True)
    model, shape, kind = build(name)
    model.eval()
    path = os.path.join(work, f"{name}.onnx")
    init = {k: v.clone() for k, v in model.state_dict().items()}
    r = {"model": name, "params": sum(p.numel() for p in model.parameters())}
    t0 = time.perf_counter()
    r["exporter"] = export(model, torch.from_numpy(sample(kind, shape, 2, 1)), path)
    r["export_seconds"] = time.perf_counter() - t0
    print(f"{name}: exported ({r['exporter']}, {os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
    model = model.cuda()
    x64 = sample(kind, shape, 64, 2)
    np.save(os.path.join(work, "x64.npy"), x64)
    np.save(os.path.join(work, "x1.npy"), x64[:1])
    dims = "x".join(str(d) for d in shape)

    # Agreement at batch 64, strict f32 everywhere.
    strict(False)
    with torch.inference_mode():
        ref = model(torch.from_numpy(x64).cuda()).float().cpu().numpy()
    seam(binary, ["run", path, "--input", f"x={work}/x64.npy", "--input-shape", f"x=64x{dims}", "--device", device,
                  "--out", os.path.join(work, "f32")])
    got = np.load(os.path.join(work, "f32", "y.npy"))
    r["seam_vs_torch"] = rel_diff(got, ref)
    sess = ort_session(path, False, cpu_ok=True)
    if sess is not None:
        ort_out = ort_run(sess, x64)
        r["seam_vs_ort"] = rel_diff(got, ort_out)
        r["ort_vs_torch"] = rel_diff(ort_out, ref)
    print(f"{name}: seam vs torch {r['seam_vs_torch']:.2e}, vs ort {r.get('seam_vs_ort', float('nan')):.2e}",
          flush=True)

    # Training.
    try:
        r["train"] = train_check(binary, model, path, kind, shape, work, a.train_device or device)
    except Exception as e:  # noqa: BLE001 - reported in the table
        r["train"] = {"error": str(e)}
    print(f"{name}: train {r['train']}", flush=True)
    if a.dump_graph:
        import onnx

        with open(os.path.join(out_dir, f"{name}_graph.txt"), "w") as f:
            f.write(onnx.helper.printable_graph(onnx.load(path).graph))
    if a.only_train:
        return r

    # Inference times (from the exported weights: training above changed the model).
    model.load_state_dict(init)
    r["times"] = []
    for tf32 in (False, True):
        strict(tf32)
        sess = ort_session(path, tf32)
        for n in (1, 64):
            x = x64[:n]
            runs = 50 if n == 1 else 10
            row = {"batch": n, "precision": "tf32" if tf32 else "f32"}
            out = seam(binary, ["run", path, "--input", f"x={work}/x{n}.npy", "--input-shape", f"x={n}x{dims}",
                                "--device", device, "--precision", row["precision"], "--time", str(runs), "--out",
                                os.path.join(work, "timed")])
            row["seam_ms"] = seam_time(out)
            row["torch_eager_ms"], row["torch_graph_ms"] = torch_times(model, x, runs)
            if sess is not None:
                row["ort_ms"] = ort_time(sess, x, runs)
            r["times"].append(row)
            print(f"{name}: {row}", flush=True)
    # Where the time goes: seam's plan at batch 64, tf32, each kernel measured.
    plan = seam(binary, ["plan", path, "--input-shape", f"x=64x{dims}", "--device", device, "--precision", "tf32",
                         "--measure"])
    with open(os.path.join(out_dir, "onnx_plans.txt"), "a") as f:
        f.write(f"### {name}\n{plan}\n")
    return r


def export_check(binary, examples, work):
    """seam's own exports (`seam export`) read by onnxruntime: its logits against `seam
    run`'s on the same random input, batch 4."""
    import onnxruntime as ort

    rows = []
    for name in examples:
        d = os.path.join(work, "exports", name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{name}.onnx")
        try:
            seam(binary, ["export", os.path.join("examples", f"{name}.json"), "--onnx", path, "--batch", "4"])
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            xi = sess.get_inputs()[0]
            shape = [int(v) for v in xi.shape]
            g = np.random.default_rng(3)
            x = (g.integers(0, 64, size=shape).astype(np.int32) if "int" in xi.type
                 else g.standard_normal(shape).astype(np.float32))
            np.save(os.path.join(d, "x.npy"), x)
            seam(binary, ["run", path, "--input", f"x={d}/x.npy", "--device", "cpu", "--out", d])
            got = np.load(os.path.join(d, "logits.npy"))
            ref = sess.run(None, {"x": x})[0]
            rows.append({"model": name, "nodes": len(__import__("onnx").load(path).graph.node),
                         "seam_vs_ort": rel_diff(got, ref)})
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append({"model": name, "error": str(e)[:300]})
        print(f"export {name}: {rows[-1]}", flush=True)
    return rows


def markdown(results, env):
    lines = [f"Measured {env}.", "",
             "| model | params | seam vs PyTorch | seam vs onnxruntime | onnxruntime vs PyTorch | 20 training steps |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | | import or run failed: {r['error'][:300]} | | | |")
            continue
        t = r["train"]
        train = (f"loss {t['loss_first']:.3f} -> {t['loss_last']:.3f} ({'falls' if t['falls'] else 'DOES NOT FALL'}); "
                 f"PyTorch {t['torch_first']:.3f} -> {t['torch_last']:.3f}, largest difference / first loss "
                 f"{t['max_rel_diff_vs_torch']:.1e}" if "error" not in t else f"failed: {t['error'][:200]}")
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['seam_vs_torch']:.1e} | "
                     f"{r.get('seam_vs_ort', float('nan')):.1e} | {r.get('ort_vs_torch', float('nan')):.1e} | {train} |")
    lines += ["", "Inference, ms per run (inputs on the device; the lower PyTorch time is the ratio's base):", "",
              "| model | batch | precision | seam | PyTorch eager | PyTorch CUDA graph | onnxruntime CUDA | "
              "seam speed-up vs best PyTorch | vs onnxruntime |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for t in r.get("times", []):
            best = min(t["torch_eager_ms"], t["torch_graph_ms"])
            ort_ms = t.get("ort_ms")
            ort_cell = "-" if ort_ms is None else "%.3f" % ort_ms
            ort_ratio = "-" if ort_ms is None else "%.2fx" % (ort_ms / t["seam_ms"])
            lines.append(f"| {r['model']} | {t['batch']} | {t['precision']} | {t['seam_ms']:.3f} | "
                         f"{t['torch_eager_ms']:.3f} | {t['torch_graph_ms']:.3f} | {ort_cell} | "
                         f"{best / t['seam_ms']:.2f}x | {ort_ratio} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seam")
    ap.add_argument("out")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v3_small", "vit_b_16", "gpt2layer"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--train-device", help="seam's device for the training check (default: --device)")
    ap.add_argument("--only-train", action="store_true", help="agreement and the training check, no times")
    ap.add_argument("--dump-graph", action="store_true", help="write each export's graph as text to OUT")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                    help="dynamo: torch.onnx.export(dynamo=True), opset 18")
    ap.add_argument("--exports", nargs="*", default=[], help="examples/NAME.json models: seam's export in onnxruntime")
    ap.add_argument("--work", default="/tmp/seam_onnx_models", help="exports and arrays (large; not under OUT)")
    a = ap.parse_args()
    global EXPORTER
    EXPORTER = a.exporter
    os.makedirs(a.out, exist_ok=True)
    import onnxruntime as ort

    env = (f"on {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, onnxruntime {ort.__version__} "
           f"({', '.join(ort.get_available_providers())})")
    print(env, flush=True)
    results = []
    for name in a.models:
        try:
            results.append(one_model(name, os.path.abspath(a.seam), a.work, a.out, a.device, a))
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the rest still run
            print(f"{name}: FAILED: {e}", flush=True)
            results.append({"model": name, "error": str(e)})
        with open(os.path.join(a.out, "onnx_models.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(a.out, "onnx_models.md"), "w") as f:
            f.write(markdown(results, env))
    exports = export_check(os.path.abspath(a.seam), a.exports, a.work) if a.exports else []
    if exports:
        table = ["", "seam's exports (`seam export`, batch 4) in onnxruntime's CPU provider against `seam run`:", "",
                 "| model | ONNX nodes | largest difference / largest logit |", "|---|---|---|"]
        for r in exports:
            table.append(f"| {r['model']} | {r.get('nodes', '-')} | "
                         f"{r['error'] if 'error' in r else '%.1e' % r['seam_vs_ort']} |")
        with open(os.path.join(a.out, "onnx_models.md"), "a") as f:
            f.write("\n".join(table) + "\n")
        print("\n".join(table))
    print(markdown(results, env))
    return 0 if all("error" not in r and "error" not in r.get("train", {}) for r in results + exports) else 1


if __name__ == "__main__":
    sys.exit(main())
