"""fused_elementwise programs (src/ops/fused_ew.h): parsed and evaluated op by op.

seam's fusion pass writes these programs; a model file may name one too, and the twin
must run it as seam's kernel does: each instruction in f32 (f64 for f64 data), never
rounded but by cast[...], with the formulas written out (the gradient ops have no torch
op), and no gradient flowing back. Apart from ops.py because it is an interpreter of its
own, with its own small language.
"""
import re

import torch

from .schema import DTYPES, HALF, fail

_SQRT1_2 = 0.70710678118654752440
_K = 0.79788456080286535588


def _sig(x):
    return 1 / (1 + torch.exp(-x))


def _gelu_tanh(x):
    return x * _sig(2 * _K * (x + 0.044715 * x * x * x))


def _gelu_tanh_grad(x):
    u2 = 2 * _K * (x + 0.044715 * x * x * x)
    s, sm = _sig(u2), _sig(-u2)
    return s + 2 * _K * x * s * sm * (1 + 3 * 0.044715 * x * x)


_EW = {
    "relu": lambda p, x: torch.where(x > 0, x, torch.zeros_like(x)),
    "leaky_relu": lambda p, x: torch.where(x > 0, x, p * x),
    "sigmoid": lambda p, x: _sig(x),
    "tanh": lambda p, x: torch.tanh(x),
    "gelu": lambda p, x: 0.5 * x * (1 + torch.erf(x * _SQRT1_2)),
    "gelu_tanh": lambda p, x: _gelu_tanh(x),
    "silu": lambda p, x: x * _sig(x),
    "exp": lambda p, x: torch.exp(x),
    "log": lambda p, x: torch.log(x),
    "sqrt": lambda p, x: torch.sqrt(x),
    "pow": lambda p, x: torch.pow(x, p),
    "scale": lambda p, x: x * p,
    "neg": lambda p, x: -x,
    "abs": lambda p, x: torch.abs(x),
    "erf": lambda p, x: torch.erf(x),
    "relu_grad": lambda p, dy, y: torch.where(y > 0, dy, torch.zeros_like(dy)),
    "leaky_relu_grad": lambda p, dy, x: torch.where(x > 0, dy, p * dy),
    "sigmoid_grad": lambda p, dy, y: dy * y * (1 - y),
    "tanh_grad": lambda p, dy, y: dy * (1 - y * y),
    "gelu_grad": lambda p, dy, x: dy * (0.5 * (1 + torch.erf(x * _SQRT1_2)) +
                                        x * 0.39894228040143267794 * torch.exp(-0.5 * x * x)),
    "gelu_tanh_grad": lambda p, dy, x: dy * _gelu_tanh_grad(x),
    "silu_grad": lambda p, dy, x: dy * _sig(x) * (1 + x * (1 - _sig(x))),
    "exp_grad": lambda p, dy, y: dy * y,
    "log_grad": lambda p, dy, x: dy / x,
    "sqrt_grad": lambda p, dy, y: dy / (2 * y),
    "pow_grad": lambda p, dy, x: dy * p * torch.pow(x, p - 1),
    "scale_grad": lambda p, dy: dy * p,
    "neg_grad": lambda p, dy: -dy,
    "abs_grad": lambda p, dy, x: torch.where(x < 0, -dy, dy),
    "erf_grad": lambda p, dy, x: dy * 1.12837916709551257390 * torch.exp(-x * x),
    "add": lambda p, a, b: a + b, "sub": lambda p, a, b: a - b, "mul": lambda p, a, b: a * b,
    "div": lambda p, a, b: a / b,
    "maximum": lambda p, a, b: torch.where(a >= b, a, b), "minimum": lambda p, a, b: torch.where(a <= b, a, b),
    "add_grad_a": lambda p, dy, a, b: dy, "add_grad_b": lambda p, dy, a, b: dy,
    "sub_grad_a": lambda p, dy, a, b: dy, "sub_grad_b": lambda p, dy, a, b: -dy,
    "mul_grad_a": lambda p, dy, a, b: dy * b, "mul_grad_b": lambda p, dy, a, b: dy * a,
    "div_grad_a": lambda p, dy, a, b: dy / b, "div_grad_b": lambda p, dy, a, b: -dy * a / (b * b),
    "maximum_grad_a": lambda p, dy, a, b: torch.where(a >= b, dy, torch.zeros_like(dy)),
    "maximum_grad_b": lambda p, dy, a, b: torch.where(a >= b, torch.zeros_like(dy), dy),
    "minimum_grad_a": lambda p, dy, a, b: torch.where(a <= b, dy, torch.zeros_like(dy)),
    "minimum_grad_b": lambda p, dy, a, b: torch.where(a <= b, torch.zeros_like(dy), dy),
}
_EW_ATTR = {"leaky_relu", "pow", "scale", "leaky_relu_grad", "pow_grad", "scale_grad"}


def parse_program(text):
    """EwProgram::parse: ([(op, attr, [operands])], [(reduce, temp, extra)]); an operand is
    ('i', j) or ('t', k)."""
    arrow = text.find("->")
    if arrow < 0:
        fail("fused_elementwise program '", text, "': no '->' before the outputs")
    code = []
    for ins in filter(None, text[:arrow].split(";")):
        m = re.fullmatch(r"(\w+)(?:\[([^\]]*)\])?\(([^)]*)\)", ins)
        if not m or (m.group(1) not in _EW and m.group(1) != "cast"):
            fail("fused_elementwise program '", text, "': '", ins, "' is not an elementwise op")
        op, attr = m.group(1), m.group(2)
        if op == "cast":
            if attr not in ("f32", "f64", "bf16", "f16"):
                fail("fused_elementwise program '", text, "': '", attr, "' is not a float dtype")
        elif op in _EW_ATTR:
            attr = float(attr)
        args = []
        for a in m.group(3).split(","):
            if not re.fullmatch(r"[it]\d+", a) or (a[0] == "t" and int(a[1:]) >= len(code)):
                fail("fused_elementwise program '", text, "': bad operand '", a, "'")
            args.append((a[0], int(a[1:])))
        arity = 1 if op == "cast" else _EW[op].__code__.co_argcount - 1
        if len(args) != arity:
            fail("fused_elementwise program '", text, "': ", op, " takes ", arity, " operand(s), got ", len(args))
        code.append((op, attr, args))
    outs = []
    rest = text[arrow + 2:]
    for m in re.finditer(r"layer_norm\[([^\]]*)\]\(t(\d+),i(\d+),i(\d+)\)|(sum|mean)\(t(\d+)\)|t(\d+)", rest):
        if m.group(1) is not None:
            outs.append(("layer_norm", int(m.group(2)), (float(m.group(1)), int(m.group(3)), int(m.group(4)))))
        elif m.group(5):
            outs.append((m.group(5), int(m.group(6)), None))
        else:
            outs.append(("none", int(m.group(7)), None))
    if not code or not outs:
        fail("fused_elementwise program '", text, "': a program needs an instruction and an output")
    if any(t >= len(code) for _, t, _ in outs):
        fail("fused_elementwise program '", text, "': an output names a temp that is not defined")
    return code, outs


def run_program(text, ins, axes=(), keepdims=0, dtypes=""):
    """The outputs of fused_elementwise (a layer norm gives three: y, mean, rstd)."""
    code, outs = parse_program(text)
    compute = torch.float64 if any(t.dtype == torch.float64 for t in ins) else torch.float32
    xs = [t.to(compute) for t in ins]
    temps = []
    for op, attr, args in code:
        vals = [xs[j] if kind == "i" else temps[j] for kind, j in args]
        if op == "cast":
            temps.append(vals[0].to(DTYPES[attr]).to(compute))
        else:
            temps.append(_EW[op](attr, *vals))
    shape = torch.broadcast_shapes(*[t.shape for t in ins])
    results = []  # (value, whether it is a layer norm's mean or rstd)
    for kind, t, extra in outs:
        v = temps[t].expand(shape)
        if kind == "none":
            results.append((v, False))
        elif kind in ("sum", "mean"):
            dims = tuple(a % v.dim() for a in axes) if axes else tuple(range(v.dim()))
            results.append(((v.sum if kind == "sum" else v.mean)(dim=dims, keepdim=bool(keepdims)) if dims else v,
                            False))
        else:
            eps, g, b = extra
            mean = v.mean(-1, keepdim=True)
            var = ((v - mean) ** 2).mean(-1, keepdim=True)
            rstd = torch.rsqrt(var + eps)
            results += [((v - mean) * rstd * xs[g] + xs[b], False), (mean.squeeze(-1), True),
                        (rstd.squeeze(-1), True)]
    names = dtypes.split(",") if dtypes else None
    if names and len(names) != len(results):
        fail("dtypes '", dtypes, "' names ", len(names), " dtype(s) for the program's ", len(results), " outputs")
    first = ins[0].dtype
    stat_dtype = torch.float32 if first in HALF else first
    return [r.to(DTYPES[names[k]] if names else stat_dtype if stat else first) for k, (r, stat) in enumerate(results)]

