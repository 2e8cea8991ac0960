"""check_step: seam's first training step (`seam step`) against the same step on the twin.

check_step runs `seam step`, loads its initial tensors and batch into a twin at the same
precision and into a float64 twin (the reference), takes one step on both, and compares
seam's loss, logits, gradients, running statistics and update against them. The judging
rules live here with their reasons: TOLERANCE by precision, ERROR_RATIO (seam may be as
far from exact as PyTorch is, times this), UPDATE_ULPS (seam's update from its own
gradients), and the near-tie retry at f32 (a ReLU or max-pool tie that rounding breaks
the other way moves a whole element's gradient). Apart from the twin itself because
nothing but this check needs `seam step`, safetensors or a seam binary.
"""
import dataclasses
import json
import math
import os
import shutil
import subprocess
import tempfile

import torch
import torch.nn.functional as F

from .model import Twin
from .ops import _nchw
from .optim import make_optimizer, split_decay, uses_f16
from .parse import load_model
from .schema import PRECISIONS, fail

# (loss relative error, tensor relative L2) by precision, between seam and the twin. f32
# (and tf32 on the CPU, which is f32): both sides compute in fp32 (seam's CPU kernels
# accumulate in double), so they differ by rounding, amplified where a gradient goes back
# through a batch norm. tf32 on the GPU: 10-bit mantissas in every GEMM. bf16 and f16:
# 16-bit GEMM operands on both sides, rounded in different places (f16 has 3 more
# mantissa bits than bf16).
TOLERANCE = {
    "f32": (1e-5, 1e-4),
    "tf32": (1e-3, 1e-2),
    "bf16": (1e-2, 5e-2),
    "f16": (1e-3, 1e-2),
}
# Past the tolerance, a tensor still passes when seam is no further from the float64
# reference (the twin in f64) than this many times the twin at the same precision: a deep
# network with batch norms at 16 bits (or at a small batch) is that far from exact on
# either side, and "as close to exact as PyTorch" is the claim that matters.
ERROR_RATIO = 2.0
# The loss curve's first steps, whose distance from float64 each side's is reported apart.
EARLY_STEPS = 10
# The update from seam's own gradients, in units of the last place of the larger of the
# parameter's old and new value: seam's CPU computes it in double and rounds once (at most
# 1/2 ulp of the result); its GPU kernel computes it in f32, as PyTorch's fused optimizers
# do, through up to eight roundings (Adam's moments, bias corrections, square root,
# quotient, decay and step). The last, the step from the old value, rounds by 1/2 ulp of
# the old or new value, the others by parts of the step, which is smaller. (A result
# near 0, a weight crossing zero, is thousands of its own ulps off that way: the unit is
# the operands', not the result's. Measured on the H200: 2.4 for SGD, 4.6 for AdamW.)
UPDATE_ULPS = {"cpu": 1.0, "cuda": 8.0}
# An operand counts as tied (a ReLU input at 0, the top two of a max-pool window) when it is
# within this many times the f32 rounding noise of the tie.
TIE_FACTOR = 10.0


def rel_l2(a, b, floor=0.0):
    """||a - b|| / max(||b||, floor), in double; 0 when both are zero."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    d = torch.linalg.vector_norm(a - b).item()
    n = max(torch.linalg.vector_norm(b).item(), floor)
    return 0.0 if d == 0 else (d / n if n > 0 else math.inf)


def ulps(exact, stored, scale=None):
    """max |exact - stored| / ulp(stored), ulp in stored's dtype: how far seam's stored
    values are from an exact (double) result, in units of their last place; with `scale`
    (a tensor of stored's shape), of ulp(max(|stored|, |scale|)) instead."""
    b = stored.detach().cpu()
    mag = b.abs() if scale is None else torch.maximum(b.abs(), scale.detach().cpu().to(b.dtype).abs())
    ulp = (torch.nextafter(mag, torch.tensor(math.inf, dtype=b.dtype)) - mag).double()
    return ((exact.detach().double().cpu() - b.double()).abs() / ulp).max().item() if b.numel() else 0.0


@dataclasses.dataclass
class Row:
    what: str
    value: float   # seam against the twin (the worst tensor)
    tol: float
    where: str = ""
    info: bool = False  # reported, not judged
    passed: bool = None  # None: value <= tol

    @property
    def ok(self):
        if self.info:
            return True
        if self.passed is not None:
            return self.passed
        return math.isfinite(self.value) and self.value <= self.tol


@dataclasses.dataclass
class CheckResult:
    model: str
    precision: str
    device: str
    batch: int
    dropout: str
    data_seed: int = 0
    seam_loss: float = math.nan
    torch_loss: float = math.nan
    ref_loss: float = math.nan
    rows: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    curve: tuple = None  # (seam, twin, f64 reference): each step's loss, with steps > 1

    @property
    def ok(self):
        return bool(self.rows) and all(r.ok for r in self.rows)

    def __bool__(self):
        return self.ok

    def report(self):
        lines = [f"{self.model} {self.precision} on {self.device}, batch {self.batch}, data seed {self.data_seed}, "
                 f"dropout {self.dropout}: loss seam {self.seam_loss:.9g} torch {self.torch_loss:.9g} "
                 f"(f64 {self.ref_loss:.9g})"]
        for r in self.rows:
            verdict = "info" if r.info else ("ok" if r.ok else "MISMATCH")
            at = f"  ({r.where})" if r.where else ""
            lines.append(f"  {r.what:26s} {r.value:10.3e}  tol {r.tol:7.1e}  {verdict}{at}")
        if self.curve:
            seam, twin, ref = self.curve
            lines.append("  step  seam         torch        f64")
            shown = sorted({0, len(seam) - 1, *range(4, len(seam), 5)})
            lines += [f"  {i + 1:4d}  {seam[i]:<11.6g}  {twin[i]:<11.6g}  {ref[i]:.6g}" for i in shown]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def _norm(ts):
    return math.sqrt(sum(torch.linalg.vector_norm(t.detach().double().cpu()).item() ** 2 for t in ts))


def compare(what, items, tol, info=False):
    """A row for named tensors (name, seam, twin, f64 reference or None). Each tensor is
    measured against max(its norm, 1e-3 of the group's), so that one that is ~0 (a bias in
    front of a batch norm) is judged on the scale of its group, not on its own rounding
    noise. A tensor passes when seam and the twin agree within tol, or when seam is no
    further from the reference than ERROR_RATIO times the twin is."""
    if not items:
        return None
    floor = 1e-3 * _norm(s for _, s, _, _ in items)
    worst, worst_at, failed = -1.0, None, None
    for name, s, t, r in items:
        d = rel_l2(s, t, floor)
        es = et = None
        ok = d <= tol
        if r is not None and not ok:
            es, et = rel_l2(s, r, floor), rel_l2(t, r, floor)
            ok = es <= ERROR_RATIO * et
        where = name + (f": vs f64 seam {es:.2e}, torch {et:.2e}" if es is not None else "")
        if not ok and failed is None:
            failed = where
        if not d <= worst:
            worst, worst_at = d, where
    at = failed or worst_at
    return Row(what, worst, tol, f"{at}; {len(items)} tensors" if len(items) > 1 else at, info, failed is None)


def _load(path):
    from safetensors.torch import load_file

    return load_file(path)


def run_seam_step(seam_binary, model_path, out_dir, precision=None, device="cpu", batch=None, data_seed=0,
                  layout=None, steps=1):
    """`seam step` into out_dir; returns its step.json."""
    cmd = [seam_binary, "step", model_path, "--out", out_dir, "--device", device, "--data-seed", str(data_seed),
           "--steps", str(steps)]
    if precision:
        cmd += ["--precision", precision]
    if batch:
        cmd += ["--batch", str(batch)]
    if layout:
        cmd += ["--layout", layout]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    with open(os.path.join(out_dir, "step.json")) as f:
        return json.load(f)


def _steps_per_epoch(info):
    """The steps an epoch `seam step`'s schedule assumed (its data's; older binaries: 60000 images)."""
    return info.get("steps_per_epoch") or max(1, 60000 // info["batch"])


def torch_step(twin, opt, sched, x, y, scaler=None):
    """One training step as seam's: forward and loss, backward (scaled at f16), gradients
    unscaled and clipped to clip_norm, a step whose loss or gradient norm is not finite
    skipped, the update, the schedule. Returns (logits, loss, {seam name: gradient})."""
    opt.zero_grad(set_to_none=True)
    logits = twin(x)
    loss = twin.loss(logits, y)
    (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(opt)
    params = list(twin.named_seam_parameters())
    for _, p in params:
        if p.grad is None:  # seam's gradient buffer holds zeros for it
            p.grad = torch.zeros_like(p)
    clip = twin.model_file.optimizer.clip_norm
    norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], clip if clip > 0 else math.inf)
    grads = {n: p.grad.detach().clone() for n, p in params}
    if scaler:
        scaler.step(opt)
        scaler.update()
    elif math.isfinite(norm.item()) and math.isfinite(loss.item()):
        opt.step()
    sched.step()
    return logits.detach(), loss.detach(), grads


def _twin_from(model, precision, dropout, init, device, reference=False):
    tw = Twin(model, "f32" if reference else precision, dropout="off" if dropout == "off" else "seam",
              reference=reference)
    tw.load_seam_tensors(init)
    return tw.to(device, torch.float64) if reference else tw.to(device)


def near_ties(twin_probe, ref_probe, factor=TIE_FACTOR):
    """{node: count} of operands whose tie (a ReLU input and 0, the top two of a max-pool
    window, the operands of a maximum) is within factor times the twin's rounding noise
    there (its value against the f64 reference's): where seam's rounding may break the tie
    the other way, and its gradient then differs by a whole element's share."""
    out = {}
    for name, (op, attrs, r) in ref_probe.items():
        t = twin_probe[name][2]
        if op in ("relu", "leaky_relu"):
            gap, noise = r[0].abs(), (t[0].double() - r[0]).pow(2).mean().sqrt()
        elif op in ("maximum", "minimum"):
            gap = (r[0] - r[1]).abs()
            noise = ((t[0].double() - t[1].double()) - (r[0] - r[1])).pow(2).mean().sqrt()
        else:
            x = _nchw(r[0], attrs)
            kh, kw = attrs["kernel"]
            if kh * kw < 2:
                continue
            sh, sw = attrs["stride"] or attrs["kernel"]
            ph, pw = attrs["padding"]
            w = F.pad(x, (pw, pw, ph, ph), value=-math.inf).unfold(2, kh, sh).unfold(3, kw, sw)
            top = w.reshape(*w.shape[:4], -1).topk(2, dim=-1).values
            gap = top[..., 0] - top[..., 1]
            noise = (t[0].double() - r[0]).pow(2).mean().sqrt()
        n = int(((gap < factor * noise) & (gap > 0)).sum())  # exact ties are exact on both sides
        if n:
            out[name] = n
    return out


def check_step(seam_binary, model_path, precision=None, device="cpu", batch=None, data_seed=0, dropout="seam",
               layout=None, verbose=True, keep_dir=None, retries=3, steps=1):
    """Runs `seam step` and the same step on the twin from seam's initial tensors and batch;
    returns a CheckResult (true when every comparison passes).

    Compared: the loss, the logits, every gradient (unscaled and clipped), the batch-norm
    running statistics after the step, and seam's update (its updated parameters against the
    torch optimizer applied to seam's own gradients; the whole step's update, seam's against
    the twin's, is reported too, not judged). The twin in float64 is the
    reference that tells rounding from a difference in what is computed (ERROR_RATIO).
    At f32, when the comparison fails on a batch where some ReLU input or max-pool window is
    within rounding of a tie, the check runs again on the next data seed (up to `retries`
    times): seam and PyTorch may break such a tie differently, and a gradient then differs
    by one element's whole contribution. The notes say which seeds were passed over and why.

    dropout: "seam" draws seam's masks in the twin (seam keeps dropout in NCHW order under a
    channels-last layout, src/passes/layout.cpp, so the masks are the same); "off" runs seam
    step on a copy of the model file with every dropout p set to 0, and the twin without.

    steps > 1: the loss curve too, over that many steps on the same batch (seam step
    --steps), seam's against the twin's and the reference's (judge_curve)."""
    m = load_model(model_path)
    precision = precision or m.precision
    if precision not in PRECISIONS:
        fail("unknown precision '", precision, "'")
    tmp = keep_dir or tempfile.mkdtemp(prefix="seam_twin_")
    os.makedirs(tmp, exist_ok=True)
    try:
        probe = Twin(m, precision)
        notes = []
        has_dropout = any(n.op == "dropout" and n.attrs["p"] > 0 for n in probe.nodes)
        path = m.source if os.path.exists(m.source) else None
        if path is None or (dropout == "off" and has_dropout):
            j = json.loads(json.dumps(m.json))
            if dropout == "off":
                for L in j["layers" if m.sequential else "nodes"]:
                    if L.get("op") == "dropout":
                        L["p"] = 0.0
            path = os.path.join(tmp, "model.json")
            with open(path, "w") as f:
                json.dump(j, f, indent=1)
        mp = load_model(path)
        retry = precision == "f32" or (precision == "tf32" and device == "cpu")
        for attempt in range(retries + 1 if retry else 1):
            seed = data_seed + attempt
            res, ties = _check_once(seam_binary, mp, path, tmp, precision, device, batch, seed, layout, dropout,
                                    want_ties=retry, steps=steps)
            res.dropout = dropout if has_dropout else "none"
            if res.ok or not ties:
                break
            what = ", ".join(f"{k} {v}" for k, v in ties.items())
            bad = ", ".join(r.what.split(" (")[0] for r in res.rows if not r.ok)
            notes.append(f"data seed {seed}: {bad} off, with operands within rounding of a tie ({what})" +
                         ("" if attempt == retries else ": next seed"))
        res.notes = notes + res.notes
    finally:
        if keep_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    if verbose:
        print(res.report(), flush=True)
    return res


def _check_once(seam_binary, mp, path, tmp, precision, device, batch, seed, layout, dropout, want_ties, steps=1):
    """One seam step and its comparison: (CheckResult, {node: near ties} or None); with
    steps > 1, the loss curve as well."""
    info = run_seam_step(seam_binary, path, tmp, precision, device, batch, seed, layout, steps)
    init, data, after = (_load(os.path.join(tmp, f + ".safetensors")) for f in ("init", "batch", "after"))
    dev = torch.device(device)
    x, y = data["x"].to(dev), data["y"].to(dev)
    res = CheckResult(mp.name, precision, device, info["batch"], dropout, seed)
    res.seam_loss = after["loss"].item()

    twin = _twin_from(mp, precision, dropout, init, dev)
    ref = _twin_from(mp, precision, dropout, init, dev, reference=True)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        opt, sched = make_optimizer(twin, steps_per_epoch=_steps_per_epoch(info))
        scaler = None
        if uses_f16(twin):
            scaler = torch.amp.GradScaler(dev.type, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                                          growth_interval=2000)
        if want_ties:
            twin.probe = {}
        logits, loss, grads = torch_step(twin, opt, sched, x, y, scaler)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    if want_ties:
        ref.probe = {}
    ref_opt, ref_sched = make_optimizer(ref, steps_per_epoch=_steps_per_epoch(info))
    ref_logits, ref_loss, ref_grads = torch_step(ref, ref_opt, ref_sched, x.double(), y)
    ties = None
    if want_ties:
        ops = {n.name: (n.op, n.attrs) for n in twin.nodes}
        ties = near_ties({k: (*ops[k], v) for k, v in twin.probe.items()},
                         {k: (*ops[k], v) for k, v in ref.probe.items()})
        twin.probe = ref.probe = None
    res.torch_loss, res.ref_loss = loss.item(), ref_loss.item()

    loss_tol, tol = TOLERANCE[precision]
    s, t, r = res.seam_loss, res.torch_loss, res.ref_loss
    d = abs(t - s) / max(abs(s), 1e-30)
    res.rows.append(Row("loss (relative)", d, loss_tol, f"vs f64 seam {abs(s - r) / abs(r):.2e}, torch "
                        f"{abs(t - r) / abs(r):.2e}", passed=d <= loss_tol or abs(s - r) <= ERROR_RATIO * abs(t - r)))
    res.rows.append(compare("logits (rel L2)", [("logits", after["logits"], logits.float(), ref_logits)], tol))
    finite = lambda gs: all(bool(torch.isfinite(g).all()) for g in gs)
    seam_skips, twin_skips = not finite(after["grad/" + n] for n in grads), not finite(grads.values())
    if seam_skips or twin_skips:
        # A loss scale that overflows f16 (65536 at the first step): the step is skipped and
        # the scale halved, on both sides if both overflow (GradScaler's rule is seam's).
        res.rows.append(Row("step skipped, non-finite", float(seam_skips != twin_skips), 0.5,
                            f"seam {'skipped' if seam_skips else 'updated'}, torch "
                            f"{'skipped' if twin_skips else 'updated'}"))
        res.notes.append("the gradients overflowed (at f16: the initial loss scale 65536), so they are not compared")
    else:
        res.rows.append(compare("gradients (rel L2)",
                                [(n, after["grad/" + n], g, ref_grads[n]) for n, g in grads.items()], tol))
    now, ref_now = twin.seam_tensors(), ref.seam_tensors()
    res.rows.append(compare("running stats (rel L2)",
                            [(n, after[n], now[n], ref_now[n]) for n in now if n not in grads], tol))
    res.rows.append(_update_from_seam_grads(twin, init, after, info["batch"], device))
    # The whole step's update, seam's against the twin's: reported, not judged. It follows from
    # the two rows above, except that Adam's first step is lr * g / (|g| + eps) elementwise, so
    # a gradient that is rounding noise on both sides (a bias in front of a batch norm, whose
    # exact gradient is 0) moves by +-lr on each side with either sign.
    res.rows.append(compare("update, twin's step", [(n, after[n] - init[n], now[n].cpu() - init[n], None)
                                                   for n in grads], tol, info=True))
    res.rows = [row for row in res.rows if row is not None]
    if not mp.master_weights and precision in ("bf16", "f16"):
        res.notes.append("16-bit parameters, updated with stochastic rounding: the update from seam's gradients "
                         "is within one 16-bit step")
    if steps > 1:
        del logits, grads, ref_logits, ref_grads, now, ref_now
        twin_curve, ref_curve = [res.torch_loss], [res.ref_loss]
        for _ in range(steps - 1):
            twin.seam_step += 1  # the next step's dropout masks
            ref.seam_step += 1
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
            try:
                twin_curve.append(torch_step(twin, opt, sched, x, y, scaler)[1].item())
            finally:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
            ref_curve.append(torch_step(ref, ref_opt, ref_sched, x.double(), y)[1].item())
        res.curve = (list(info["losses"]), twin_curve, ref_curve)
        res.rows.append(judge_curve(*res.curve, loss_tol))
    return res, ties


def judge_curve(seam, twin, ref, tol):
    """A row for the loss curves (one loss a step): seam's passes when it is within tol of
    the twin's at every step (relative), or, over the whole curve, no further from the f64
    reference's than ERROR_RATIO times the twin's is (root mean square). Two runs at 16 bits
    drift apart as their roundings compound, so the second rule is the one that tells a
    mistake (seam's curve leaving the exact one) from drift (both beside it by as much)."""
    if len(seam) != len(twin):
        return Row("loss curve", math.inf, tol, f"seam took {len(seam)} steps, the twin {len(twin)}")
    # A non-finite loss on either side counts as infinitely far (max() would pass over a NaN).
    rel = [abs(s - t) / max(abs(t), 1e-30) for s, t in zip(seam, twin)]
    rel = [r if math.isfinite(r) else math.inf for r in rel]
    worst = max(range(len(rel)), key=lambda i: rel[i])
    rms = lambda a: math.sqrt(sum((u - r) ** 2 for u, r in zip(a, ref)) / len(ref))
    es, et = rms(seam), rms(twin)
    # Reported, not judged: the first EARLY_STEPS, before 16-bit runs on one batch turn
    # chaotic (W6's do by step 12, docs/perf.md), where run-to-run noise is small and an
    # offset common to every run of one side shows.
    early = min(EARLY_STEPS, len(ref))
    far = lambda a: max((abs(u - r) for u, r in zip(a[:early], ref[:early])), default=0.0)
    return Row(f"loss curve, {len(seam)} steps", rel[worst], tol,
               f"worst at step {worst + 1}: seam {seam[worst]:.6g}, torch {twin[worst]:.6g}; rms vs f64 seam "
               f"{es:.2e}, torch {et:.2e}; first {early} steps' largest distance from f64 seam {far(seam):.2e}, "
               f"torch {far(twin):.2e}; last: seam {seam[-1]:.6g}, torch {twin[-1]:.6g}, f64 {ref[-1]:.6g}",
               passed=rel[worst] <= tol or es <= ERROR_RATIO * et)


def _update_from_seam_grads(twin, init, after, batch, device):
    """seam's update alone: the torch optimizer, in double, from seam's initial parameters and
    seam's gradients (already unscaled and clipped), against seam's updated parameters; the
    largest distance in units of the last place of the larger of each parameter's old and new
    value (UPDATE_ULPS, which also covers the stochastic rounding of 16-bit parameters)."""
    names = [n for n, _ in twin.named_seam_parameters()]
    params = {n: torch.nn.Parameter(init[n].double().clone()) for n in names}
    c = twin.model_file.optimizer
    groups = split_decay(((n, params[n]) for n in names), twin.decay_names.__contains__, c.weight_decay)
    opt, _ = make_optimizer(twin, steps_per_epoch=max(1, 60000 // batch), groups=groups, foreach=False)
    finite = all(torch.isfinite(after["grad/" + n]).all() for n in names)
    for n in names:
        params[n].grad = after["grad/" + n].double()
    if finite:
        opt.step()
    worst, at = 0.0, names[0] if names else ""
    for n in names:
        e = ulps(params[n], after[n], scale=init[n])
        if not e <= worst:
            worst, at = e, n
    return Row("update from seam's grads", worst, UPDATE_ULPS[device.split(":")[0]], f"{at}, in ulps; {len(names)} tensors")

