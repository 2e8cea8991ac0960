"""seam's op table and the model file's vocabulary, as data, and the error every module raises.

What `seam ops` lists (src/ops/*.cpp: each forward op's operands and attributes with their
defaults), the layers a model file may create (src/io/model_file.cpp's kLayers), the keys
it accepts, and the sets of ops the rest of the package treats specially (computed in f32,
kinked, without a gradient, with weight decay). Kept apart from the code that reads or
runs a model so that test_op_table_is_seams can hold it against `seam ops` on its own, and
so that a change in seam's op set is a change in this one file. It imports nothing else
of the package: every other module builds on it.
"""
import re
import subprocess

import torch

HALF = (torch.bfloat16, torch.float16)
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
          "i32": torch.int32, "u8": torch.uint8}
LOW = {"bf16": torch.bfloat16, "f16": torch.float16}
PRECISIONS = ["f32", "tf32", "bf16", "f16"]


class ModelFileError(ValueError):
    """A model file seam would refuse, or one the twin cannot build (the message names the place)."""


def fail(*parts):
    raise ModelFileError("".join(str(p) for p in parts))


# ---------------------------------------------------------------------------------------
# The op schemas: `seam ops` (src/ops/*.cpp), the forward ops only. An attribute's default
# gives its type (int, float, int list, string); Req(type) marks a required one.


class Req:
    def __init__(self, kind):
        self.kind = kind


UNARY = {"relu": {}, "leaky_relu": {"alpha": 0.01}, "sigmoid": {}, "tanh": {}, "gelu": {}, "gelu_tanh": {},
         "silu": {}, "exp": {}, "log": {}, "sqrt": {}, "pow": {"exponent": Req(float)},
         "scale": {"factor": Req(float)}, "neg": {}, "abs": {}, "erf": {}}
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
_REDUCE = {"axes": [], "keepdims": 0, "dtype": ""}
_POOL = {"kernel": Req(list), "stride": [], "padding": [0, 0], "layout": "nchw"}
SCHEMAS = {
    **{k: (["x"], v) for k, v in UNARY.items()},
    **{k: (["a", "b"], {}) for k in BINARY},
    "fused_elementwise": (["xs..."], {"program": Req(str), "axes": [], "keepdims": 0, "dtypes": ""}),
    "full": ([], {"shape": Req(list), "value": 0.0, "dtype": "f32"}),
    "loss_scale": ([], {"init": 65536.0}),
    "cast": (["x"], {"dtype": Req(str)}),
    "copy": (["x"], {}),
    "stop_gradient": (["x"], {}),
    "argmax": (["x"], {"axis": -1, "classes": 0}),
    "count_equal": (["a", "b"], {}),
    "accumulate": (["acc", "xs..."], {"training": 1}),
    "dropout": (["x"], {"p": 0.5, "stream": 0, "training": 1}),
    "embedding": (["ids", "weight"], {}),
    "matmul": (["a", "b"], {"transpose_a": 0, "transpose_b": 0, "dtype": ""}),
    "linear": (["x", "w", "b?"], {}),
    "linear_act": (["x", "w", "b?"], {"act": "relu"}),
    "linear_act_aux": (["x", "w", "b?"], {"act": "relu"}),
    "sum": (["x"], dict(_REDUCE)),
    "mean": (["x"], dict(_REDUCE)),
    "broadcast_to": (["x"], {"shape": Req(list)}),
    "reshape": (["x"], {"shape": Req(list)}),
    "flatten": (["x"], {"start_dim": 1, "end_dim": -1}),
    "transpose": (["x"], {"perm": Req(list)}),
    "concat": (["xs..."], {"axis": Req(int)}),
    "slice": (["x"], {"axis": Req(int), "start": 0, "end": Req(int), "step": 1}),
    "softmax": (["x"], {"axis": -1}),
    "log_softmax": (["x"], {"axis": -1}),
    "cross_entropy": (["logits", "labels"], {"ignore_index": -100, "label_smoothing": 0.0, "classes": 0}),
    "mse": (["prediction", "target"], {}),
    "layer_norm": (["x", "gamma", "beta"], {"eps": 1e-5}),
    "batch_norm": (["x", "gamma", "beta", "running_mean", "running_var", "z?"],
                   {"momentum": 0.1, "eps": 1e-5, "training": 1, "layout": "nchw", "activation": "none"}),
    "conv2d": (["x", "w", "b?"], {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                                  "layout": "nchw"}),
    "max_pool2d": (["x"], dict(_POOL)),
    "avg_pool2d": (["x"], {**_POOL, "count_include_pad": 1}),
    "global_avg_pool": (["x"], {"layout": "nchw"}),
    "attention": (["q", "k", "v"], {"causal": 0, "scale": 0.0, "dropout": 0.0, "stream": 0, "training": 1}),
    "attention_qkv": (["qkv"], {"causal": 0, "scale": 0.0, "dropout": 0.0, "stream": 0, "training": 1}),
}
# Layers that create their parameters (model_file.cpp's kLayers), with their settings.
LAYERS = {"linear": ["out", "bias", "tie"], "conv2d": ["out", "kernel", "stride", "padding", "dilation", "groups", "bias"],
          "batch_norm": ["momentum", "eps"], "layer_norm": ["eps"], "embedding": ["num", "dim"],
          "position_embedding": ["num"]}
# The layers whose weight seam creates with weight decay (src/nn.cpp); no bias and no norm
# parameter decays. Both the twin and a plain torch module (module_param_groups) split
# their parameters by it, so that every side of a comparison runs the same optimizer.
DECAY_LAYERS = {"linear", "conv2d", "embedding", "position_embedding"}
NODE_KEYS = ["op", "name", "inputs", "input", "precision"]
TOP_KEYS = ["name", "input", "classes", "layers", "nodes", "model", "output", "loss", "optimizer", "batch_size", "epochs",
            "seed", "device", "precision", "master_weights", "layout", "deterministic", "recompute", "output_chunks", "memory_budget_gib",
            "data", "description"]
# Ops of `seam ops` that no model file can use, and why (seam refuses them the same way).
UNREACHABLE = {
    "full": "it takes no operand, and a model-file entry always has one (the previous layer or its inputs)",
    "loss_scale": "it takes no operand, and a model-file entry always has one",
    "accumulate": "its first operand must be a state value, and a model file names none",
    "stop_gradient": "model files refuse every op whose name contains '_grad'",
}
# Ops whose gradient jumps where operands tie (ReLU at 0, the maximum of a pool window, ...).
KINK_OPS = {"relu", "leaky_relu", "max_pool2d", "maximum", "minimum"}
# seam's precision pass: ops that compute in f32 at every precision, and ops it leaves alone.
F32_OPS = {"softmax", "log_softmax", "cross_entropy", "mse", "layer_norm", "batch_norm", "sum", "mean"}
KEEP_OPS = {"cast", "full", "argmax", "count_equal", "accumulate"}
# No gradient flows back through these (their OpDef has no gradient rule).
NO_GRADIENT = {"fused_elementwise", "argmax", "count_equal", "linear_act", "linear_act_aux"}


def model_file_ops():
    """Every op a model file accepts: the forward ops of `seam ops` and the layers."""
    return sorted(k for k in SCHEMAS if k not in UNREACHABLE)


def seam_ops(seam_binary):
    """`seam ops` parsed: {op: (inputs, {attribute: its default as printed, None if required})}."""
    text = subprocess.run([seam_binary, "ops"], check=True, capture_output=True, text=True).stdout
    ops = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\((.*)\) -> ", line)
        if not m:
            continue
        inside = m.group(2)
        if "; " in inside:
            inputs, attrs = inside.split("; ", 1)
        elif "=" in inside or ":" in inside:
            inputs, attrs = "", inside
        else:
            inputs, attrs = inside, ""
        parsed = {}
        for a in filter(None, attrs.split(", ")):
            if "=" in a:
                k, v = a.split("=", 1)
                parsed[k] = v
            else:
                parsed[a.split(":", 1)[0]] = None
        ops[m.group(1)] = ([i for i in inputs.split(", ") if i], parsed)
    return ops
