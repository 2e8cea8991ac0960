"""The forward op of every op name a model file uses (OPS), and seam's dropout masks.

OPS[op](twin, node, inputs) computes a node's value with PyTorch's ops, following seam's
precision policy where autocast's differs (norms, softmax, losses and reductions in f32,
seam's tie rule for maximum and minimum). Each op reads its node's parameters and the
twin's mode through the Twin it is given, so the table holds no state and model.py
holds no op. The same functions run on meta tensors when the Twin is built: that is the
shape and dtype inference, and the operand checks here turn a file the twin cannot
build into a ModelFileError when it is loaded, not when it first runs.
"""
import torch
import torch.nn.functional as F

from .fused import run_program
from .schema import DTYPES, HALF, fail


# ---------------------------------------------------------------------------------------
# seam's dropout masks: Philox4x32-10 (src/common/philox.h), in int64 arithmetic that never
# overflows, so it runs on any device.

_M32 = 0xFFFFFFFF


def _mul_hi_lo(a, b):
    """(hi, lo) 32-bit words of a * b for a: tensor of values < 2^32, b: a 32-bit constant."""
    t0 = a * (b & 0xFFFF)
    t1 = a * (b >> 16)
    lo = t0 + ((t1 & 0xFFFF) << 16)
    return ((t1 >> 16) + (lo >> 32)) & _M32, lo & _M32


def philox_uniform(seed, step, stream, n, device="cpu"):
    """dropout_uniform(seed, step, stream, i) for i in [0, n): float32 in [0, 1)."""
    blocks = (n + 3) // 4
    b = torch.arange(blocks, dtype=torch.int64, device=device)
    c0, c1 = b & _M32, b >> 32
    c2 = torch.full_like(b, step & _M32)
    c3 = torch.full_like(b, stream & _M32)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi0, lo0 = _mul_hi_lo(c0, 0xD2511F53)
        hi1, lo1 = _mul_hi_lo(c2, 0xCD9E8D57)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    words = torch.stack([c0, c1, c2, c3], 1).reshape(-1)[:n]
    return (words >> 8).to(torch.float32) * (1.0 / 16777216.0)


# ---------------------------------------------------------------------------------------
# Forward ops: f(twin, node, inputs) -> the node's value (its first output).


def _as_f32(t):
    return t.float() if t.dtype in HALF else t


def _nchw(x, attrs):
    return x.permute(0, 3, 1, 2) if attrs.get("layout") == "nhwc" else x


def _back(y, attrs):
    return y.permute(0, 2, 3, 1) if attrs.get("layout") == "nhwc" else y


def _float_only(node, ins, *which):
    for i in which or range(len(ins)):
        if not ins[i].is_floating_point():
            fail(node.where, ": input ", i, " must be floating point, got ", ins[i].dtype)


def _unary(fn):
    def run(tw, node, ins):
        _float_only(node, ins)
        return fn(ins[0], node.attrs)
    return run


def _binary(fn):
    def run(tw, node, ins):
        _float_only(node, ins)
        if tw._building and ins[0].dtype != ins[1].dtype:
            fail(node.where, ": inputs must share one dtype, got ", ins[0].dtype, " and ", ins[1].dtype)
        return fn(ins[0], ins[1])
    return run


def _same_dtype(tw, node, ts):
    """seam's raw graph (before its precision pass) takes a GEMM's operands in one dtype."""
    if tw._building and len({t.dtype for t in ts}) > 1:
        fail(node.where, ": inputs must share one dtype, got ", ", ".join(str(t.dtype) for t in ts))


def _linear_layer(tw, node, ins):
    _float_only(node, ins)
    _same_dtype(tw, node, [ins[0], tw._param(node, "weight")])
    x, w, b = tw._gemm(node, [ins[0], tw._param(node, "weight")]) + [tw._param(node, "bias")]
    if b is not None and not tw._building and tw._low_of(node) is None:
        b = _as_f32(b)
    return F.linear(x, w, b)


def _conv_layer(tw, node, ins):
    _float_only(node, ins)
    _same_dtype(tw, node, [ins[0], tw._param(node, "weight")])
    a = node.attrs
    x, w = tw._gemm(node, [ins[0], tw._param(node, "weight")])
    return F.conv2d(x, w, tw._param(node, "bias"), a["stride"], a["padding"], a["dilation"], a["groups"])


def _batch_norm_layer(tw, node, ins):
    _float_only(node, ins)
    x, a = ins[0], node.attrs
    y = F.batch_norm(_as_f32(x), tw._param(node, "running_mean"), tw._param(node, "running_var"),
                     tw._param(node, "weight"), tw._param(node, "bias"), training=True, momentum=a["momentum"],
                     eps=a["eps"])
    return y.to(x.dtype)


def _layer_norm_layer(tw, node, ins):
    _float_only(node, ins)
    x = ins[0]
    y = F.layer_norm(_as_f32(x), (x.shape[-1],), tw._param(node, "weight"), tw._param(node, "bias"),
                     node.attrs["eps"])
    return y.to(x.dtype)


def _embedding_layer(tw, node, ins):
    y = F.embedding(ins[0].long(), tw._param(node, "weight"))
    low = None if tw._building else tw._low_of(node)
    return y.to(low) if low is not None else y  # seam reads the weight's 16-bit working copy


def _position_embedding_layer(tw, node, ins):
    """nn::position_embedding: x plus the table's first T rows (seam's add of the two)."""
    x = ins[0]
    return torch.add(x, tw._param(node, "weight")[: x.shape[1]])


def _cast(tw, node, ins):
    x, name = ins[0], node.attrs["dtype"]
    if name not in DTYPES:
        fail(node.where, ": unknown dtype '", name, "' (f32, f64, bf16, f16, i32, u8)")
    to = DTYPES[name]
    if to.is_floating_point:
        return x.to(to)
    lo, hi = (-2147483648.0, 2147483647.0) if to == torch.int32 else (0.0, 255.0)
    v = x.detach().double()
    v = torch.where(torch.isnan(v), torch.zeros_like(v), v.trunc().clamp(lo, hi))
    return v.to(to)


def _reduce(kind):
    def run(tw, node, ins):
        _float_only(node, ins)
        x, a = ins[0], node.attrs
        if any(not -max(x.dim(), 1) <= d < max(x.dim(), 1) for d in a["axes"]):
            fail(node.where, ": an axis of ", a["axes"], " is out of range for rank ", x.dim())
        dims = [d % max(x.dim(), 1) for d in a["axes"]] if a["axes"] else list(range(x.dim()))
        if len(set(dims)) != len(dims):
            fail(node.where, ": an axis is listed twice")
        src = _as_f32(x)
        y = (src.sum if kind == "sum" else src.mean)(dim=tuple(dims), keepdim=bool(a["keepdims"])) if dims else src
        if a["dtype"]:
            return y.to(DTYPES[a["dtype"]])
        return y if x.dtype in HALF else y.to(x.dtype)  # f32 for 16-bit x (precision pass), else x's dtype
    return run


def _softmax(log):
    def run(tw, node, ins):
        _float_only(node, ins)
        x = ins[0]
        y = (F.log_softmax if log else F.softmax)(_as_f32(x), dim=node.attrs["axis"])
        return y.to(x.dtype)
    return run


def _slice(tw, node, ins):
    x, a = ins[0], node.attrs
    if a["step"] < 1:
        fail(node.where, ": step must be >= 1, got ", a["step"])
    axis = a["axis"] % x.dim()
    y = x[(slice(None),) * axis + (slice(a["start"], a["end"], a["step"]),)]
    if y.shape[axis] == 0:
        fail(node.where, ": slice [", a["start"], ":", a["end"], "] of axis ", axis, " is empty")
    return y


def _matmul(tw, node, ins):
    _float_only(node, ins)
    _same_dtype(tw, node, ins)
    a, b = tw._gemm(node, ins)
    if a.dim() < 2 or b.dim() < 2:
        fail(node.where, ": both operands need rank >= 2")
    if node.attrs["transpose_a"]:
        a = a.transpose(-1, -2)
    if node.attrs["transpose_b"]:
        b = b.transpose(-1, -2)
    y = torch.matmul(a, b)
    return y.to(DTYPES[node.attrs["dtype"]]) if node.attrs["dtype"] else y


def _attention(tw, node, ins):
    """seam's attention (q, k, v on [B, H, T, D]): a GEMM-kind op for the precision policy,
    as torch's scaled_dot_product_attention at the same scale and causal mask."""
    _float_only(node, ins)
    _same_dtype(tw, node, ins)
    q, k, v = tw._gemm(node, ins)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        fail(node.where, ": q, k and v must be [B, H, T, D]")
    a = node.attrs
    p = a["dropout"] if not tw._building else 0.0
    if p > 0 and tw.dropout_mode == "seam":
        # seam's masks: the dropout op's on the [B, H, Tq, Tk] probabilities, same stream.
        s = (q @ k.transpose(-1, -2)).float() * (a["scale"] if a["scale"] > 0 else q.shape[-1] ** -0.5)
        if a["causal"]:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        probs = torch.softmax(s, dim=-1)  # in f32, as seam's kernels compute it
        return (tw._dropout(node, probs, p=p) @ v.float()).to(q.dtype)
    scale = a["scale"] if a["scale"] > 0 else None
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(a["causal"]), scale=scale,
                                          dropout_p=p if tw.dropout_mode == "torch" else 0.0)


def _attention_qkv(tw, node, ins):
    """qkv [B, T, 3, H, D] -> o [B, T, H, D]: attention on the heads, moved before T."""
    if ins[0].dim() != 5 or ins[0].shape[2] != 3:
        fail(node.where, ": qkv must be [B, T, 3, H, D], got ", list(ins[0].shape))
    q, k, v = (x.transpose(1, 2) for x in ins[0].unbind(2))
    return _attention(tw, node, [q, k, v]).transpose(1, 2)


def _linear_act(tw, node, ins):
    act = node.attrs["act"]
    if act not in ("relu", "gelu_tanh"):
        fail(node.where, ": act must be relu or gelu_tanh, got '", act, "'")
    with torch.no_grad():
        y = F.linear(*tw._gemm(node, ins))
        return F.relu(y) if act == "relu" else F.gelu(y, approximate="tanh")


def _classes(x, node, axis=-1):
    """The first `classes` entries along the axis (all for 0): the rest is padding."""
    c = node.attrs.get("classes", 0)
    return x.narrow(axis, 0, c) if c else x


def _cross_entropy(tw, node, ins):
    logits, labels = ins
    a = node.attrs
    logits = _classes(logits, node)
    z = _as_f32(logits).reshape(-1, logits.shape[-1])
    lab = labels.reshape(-1).long()
    total = F.cross_entropy(z, lab, ignore_index=a["ignore_index"], label_smoothing=a["label_smoothing"],
                            reduction="sum")
    return total / (lab != a["ignore_index"]).sum().clamp(min=1)


def _mse(tw, node, ins):
    p, t = ins
    dt = torch.promote_types(_as_f32(p).dtype, _as_f32(t).dtype)
    return F.mse_loss(p.to(dt), t.to(dt))


def _fused(tw, node, ins):
    _float_only(node, ins)
    a = node.attrs
    with torch.no_grad():
        return run_program(a["program"], ins, a["axes"], a["keepdims"], a["dtypes"])[0]


def _pool_input(node, x):
    if x.dim() != 4:
        fail(node.where, ": x must be [N, C, H, W], got ", list(x.shape))
    return x


def _max_pool(tw, node, ins):
    _float_only(node, ins)
    _pool_input(node, ins[0])
    a = node.attrs
    return _back(F.max_pool2d(_nchw(ins[0], a), a["kernel"], a["stride"] or a["kernel"], a["padding"]), a)


def _avg_pool(tw, node, ins):
    _float_only(node, ins)
    _pool_input(node, ins[0])
    a = node.attrs
    return _back(F.avg_pool2d(_nchw(ins[0], a), a["kernel"], a["stride"] or a["kernel"], a["padding"],
                              count_include_pad=bool(a["count_include_pad"])), a)


def _global_avg_pool(tw, node, ins):
    _float_only(node, ins)
    x = ins[0]
    if x.dim() != 4:
        fail(node.where, ": input 0 must have rank 4, got ", x.dim())
    return x.mean(dim=(1, 2) if node.attrs["layout"] == "nhwc" else (2, 3))


def _concat(tw, node, ins):
    if tw._building and len({t.dtype for t in ins}) > 1:
        fail(node.where, ": inputs must share one dtype")
    return torch.cat(ins, dim=node.attrs["axis"])


def _flatten(tw, node, ins):
    x = ins[0]
    if x.dim() == 0:
        return x.reshape(1)
    return torch.flatten(x, node.attrs["start_dim"], node.attrs["end_dim"])


OPS = {
    "relu": _unary(lambda x, a: F.relu(x)),
    "leaky_relu": _unary(lambda x, a: F.leaky_relu(x, a["alpha"])),
    "sigmoid": _unary(lambda x, a: torch.sigmoid(x)),
    "tanh": _unary(lambda x, a: torch.tanh(x)),
    "gelu": _unary(lambda x, a: F.gelu(x)),
    "gelu_tanh": _unary(lambda x, a: F.gelu(x, approximate="tanh")),
    "silu": _unary(lambda x, a: F.silu(x)),
    "exp": _unary(lambda x, a: torch.exp(x)),
    "log": _unary(lambda x, a: torch.log(x)),
    "sqrt": _unary(lambda x, a: torch.sqrt(x)),
    "pow": _unary(lambda x, a: torch.pow(x, a["exponent"])),
    "scale": _unary(lambda x, a: x * a["factor"]),
    "neg": _unary(lambda x, a: -x),
    "abs": _unary(lambda x, a: torch.abs(x)),
    "erf": _unary(lambda x, a: torch.erf(x)),
    "add": _binary(torch.add),
    "sub": _binary(torch.sub),
    "mul": _binary(torch.mul),
    "div": _binary(torch.div),
    # seam's rule on ties (a >= b takes a, and a's gradient), not torch.maximum's split.
    "maximum": _binary(lambda a, b: torch.where(a >= b, a, b)),
    "minimum": _binary(lambda a, b: torch.where(a <= b, a, b)),
    "fused_elementwise": _fused,
    "cast": _cast,
    "copy": lambda tw, node, ins: ins[0].clone(),
    "argmax": lambda tw, node, ins: torch.argmax(_classes(ins[0].detach(), node, node.attrs["axis"]),
                                                 dim=node.attrs["axis"]).to(torch.int32),
    "count_equal": lambda tw, node, ins: ((ins[0] == ins[1]) & (ins[1] >= 0)).sum().to(torch.int32),
    "dropout": lambda tw, node, ins: (_float_only(node, ins), tw._dropout(node, ins[0]))[1],
    "embedding": _embedding_layer,
    "position_embedding": _position_embedding_layer,
    "matmul": _matmul,
    "attention": _attention,
    "attention_qkv": _attention_qkv,
    "linear": _linear_layer,
    "linear_act": _linear_act,
    "linear_act_aux": _linear_act,
    "sum": _reduce("sum"),
    "mean": _reduce("mean"),
    "broadcast_to": lambda tw, node, ins: ins[0].broadcast_to(node.attrs["shape"]),
    "reshape": lambda tw, node, ins: ins[0].reshape(node.attrs["shape"]),
    "flatten": _flatten,
    "transpose": lambda tw, node, ins: ins[0].permute(node.attrs["perm"]),
    "concat": _concat,
    "slice": _slice,
    "softmax": _softmax(False),
    "log_softmax": _softmax(True),
    "cross_entropy": _cross_entropy,
    "mse": _mse,
    "layer_norm": _layer_norm_layer,
    "batch_norm": _batch_norm_layer,
    "conv2d": _conv_layer,
    "max_pool2d": _max_pool,
    "avg_pool2d": _avg_pool,
    "global_avg_pool": _global_avg_pool,
}

