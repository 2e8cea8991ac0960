"""Reading a model file as src/io/model_file.cpp does: the same keys, defaults and errors.

load_model gives a ModelFile (io::ModelSpec: the top-level settings and the optimizer),
parse_nodes its entries as Nodes, each with its operands named and its attributes
complete and typed. Only the file's syntax is checked here; shapes and dtypes are
inferred, and checked, by running the Twin once on meta tensors (model.py), with the ops
that run the real step, so the two cannot disagree.
"""
import dataclasses
import json
import os

from .optim import Optimizer, Schedule
from .schema import (F32_OPS, KEEP_OPS, LAYERS, LOW, NODE_KEYS, PRECISIONS, SCHEMAS, TOP_KEYS, UNREACHABLE, Req,
                     fail)


def _nearest(name, known):
    def dist(a, b):
        d = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            prev, d[0] = d[0], i
            for j, cb in enumerate(b, 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
        return d[len(b)]

    close = sorted((dist(name, k), k) for k in known)
    close = [k for n, k in close if n <= max(2, len(name) // 3)][:3]
    return "; did you mean " + ", ".join(f"'{k}'" for k in close) + "?" if close else ""


def _unknown(where, what, name, known):
    fail(where, ": unknown ", what, " '", name, "'", _nearest(name, known))


def _check_keys(obj, allowed, where):
    if not isinstance(obj, dict):
        fail(where, ": must be an object")
    for k in obj:
        if k not in allowed:
            _unknown(where, "key", k, allowed)


def _get(obj, key, default, kind, where):
    if key not in obj:
        return default
    v = obj[key]
    ok = {"str": lambda: isinstance(v, str),
          "bool": lambda: isinstance(v, bool),
          "int": lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
          "float": lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
          "floats": lambda: isinstance(v, list) and all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                        for e in v),
          "ints": lambda: isinstance(v, list) and all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                      for e in v)}[kind]()
    if not ok:
        fail(where, ": '", key, "' has the wrong type (", json.dumps(v), ")")
    if kind == "int":
        return int(v)
    if kind == "float":
        return float(v)
    if kind == "ints":
        return [int(e) for e in v]
    if kind == "floats":
        return [float(e) for e in v]
    return v



def _parse_optimizer(o, where):
    _check_keys(o, ["type", "lr", "momentum", "dampening", "nesterov", "betas", "eps", "weight_decay", "clip_norm",
                    "schedule"], where)
    kind = _get(o, "type", "adam", "str", where)
    if kind not in ("sgd", "adam", "adamw"):
        _unknown(where, "optimizer type", kind, ["sgd", "adam", "adamw"])
    c = Optimizer(kind=kind, lr=0.01 if kind == "sgd" else 1e-3, weight_decay=0.01 if kind == "adamw" else 0.0)
    c.lr = _get(o, "lr", c.lr, "float", where)
    c.momentum = _get(o, "momentum", c.momentum, "float", where)
    c.dampening = _get(o, "dampening", c.dampening, "float", where)
    c.nesterov = _get(o, "nesterov", c.nesterov, "bool", where)
    betas = _get(o, "betas", list(c.betas), "floats", where)
    if len(betas) != 2:
        fail(where, ": 'betas' needs two numbers")
    c.betas = tuple(betas)
    c.eps = _get(o, "eps", c.eps, "float", where)
    c.weight_decay = _get(o, "weight_decay", c.weight_decay, "float", where)
    c.clip_norm = _get(o, "clip_norm", c.clip_norm, "float", where)
    if "schedule" in o:
        s, w = o["schedule"], where + ".schedule"
        _check_keys(s, ["type", "warmup_steps", "step_size", "gamma", "total_steps", "min_lr"], w)
        kind = _get(s, "type", "constant", "str", w)
        if kind not in ("constant", "step", "cosine"):
            _unknown(w, "schedule type", kind, ["constant", "step", "cosine"])
        c.schedule = Schedule(kind, _get(s, "warmup_steps", 0, "int", w), _get(s, "step_size", 1, "int", w),
                              _get(s, "gamma", 0.1, "float", w), _get(s, "total_steps", 0, "int", w),
                              _get(s, "min_lr", 0.0, "float", w))
    c.total_from_run = c.schedule.kind == "cosine" and c.schedule.total_steps == 0
    if c.total_from_run:
        c.schedule.total_steps = 1
    # OptimizerConfig::validate
    if not c.lr >= 0:
        fail(where, ": ", kind, ": lr must be >= 0, got ", c.lr)
    if not c.weight_decay >= 0:
        fail(where, ": ", kind, ": weight_decay must be >= 0, got ", c.weight_decay)
    if not c.clip_norm >= 0:
        fail(where, ": ", kind, ": clip_norm must be >= 0 (0 = off), got ", c.clip_norm)
    if kind == "sgd":
        if not c.momentum >= 0:
            fail(where, ": sgd: momentum must be >= 0, got ", c.momentum)
        if c.nesterov and (c.momentum <= 0 or c.dampening != 0):
            fail(where, ": sgd: nesterov needs momentum > 0 and dampening = 0")
    else:
        if not 0 <= c.betas[0] < 1 or not 0 <= c.betas[1] < 1:
            fail(where, ": ", kind, ": betas must be in [0, 1), got ", list(c.betas))
        if not c.eps > 0:
            fail(where, ": ", kind, ": eps must be > 0, got ", c.eps)
    if c.schedule.warmup_steps < 0:
        fail(where, ": schedule: warmup_steps must be >= 0")
    if c.schedule.kind == "step" and c.schedule.step_size < 1:
        fail(where, ": schedule: step_size must be >= 1")
    if c.schedule.kind == "cosine" and c.schedule.total_steps < 1:
        fail(where, ": schedule: cosine needs total_steps >= 1")
    return c


@dataclasses.dataclass
class ModelFile:
    """A parsed model file (io::ModelSpec)."""
    source: str
    json: dict
    name: str = "model"
    input_shape: list = None
    classes: int = 10
    sequential: bool = True
    layers: list = None
    batch_size: int = 128
    epochs: int = 10
    seed: int = 0
    device: str = "auto"
    precision: str = "f32"
    master_weights: bool = True
    layout: str = "auto"
    label_smoothing: float = 0.0
    optimizer: Optimizer = None
    val_split: float = 0.0
    crop_padding: int = 0
    horizontal_flip: bool = False
    input_dtype: str = "f32"
    gpt: dict = None  # "model": {"type": "gpt", ...}, its settings complete

    def total_steps(self, steps_per_epoch):
        """ModelSpec::fix_schedule_length: a cosine schedule's length when the file left it out."""
        s = self.optimizer.schedule
        if self.optimizer.total_from_run:
            return max(1, self.epochs * steps_per_epoch - s.warmup_steps)
        return s.total_steps


def load_model(model):
    """A ModelFile from a path, a JSON text, a dict, or a ModelFile (returned as it is)."""
    if isinstance(model, ModelFile):
        return model
    if isinstance(model, dict):
        return parse_model(model, "<model>")
    if isinstance(model, str) and model.lstrip().startswith("{"):
        return parse_model(json.loads(model), "<model>")
    with open(model) as f:
        text = f.read()
    try:
        j = json.loads(text)
    except json.JSONDecodeError as e:
        fail(model, ":", e.lineno, ":", e.colno, ": malformed JSON: ", e.msg)
    return parse_model(j, os.fspath(model))


def parse_model(j, source):
    if not isinstance(j, dict):
        fail(source, ": a model file is a JSON object")
    _check_keys(j, TOP_KEYS, source)
    s = ModelFile(source=source, json=j)
    s.name = _get(j, "name", "model", "str", source)
    if ("layers" in j) + ("nodes" in j) + ("model" in j) != 1:
        fail(source, ": give exactly one of 'layers' (a sequence), 'nodes' (a graph) or 'model' (a built-in network)")
    if "model" in j:
        s.gpt = _parse_gpt(j["model"], source + ": model")
        s.input_shape, s.input_dtype = [s.gpt["block_size"]], "i32"
        s.sequential, s.layers = False, gpt_nodes(s.gpt)
    else:
        if "input" not in j:
            fail(source, ": 'input' is missing (e.g. \"input\": {\"shape\": [1, 28, 28]})")
        s.sequential = "layers" in j
        s.layers = j["layers"] if s.sequential else j["nodes"]
        if not isinstance(s.layers, list) or not s.layers:
            fail(source, ": '", "layers" if s.sequential else "nodes", "' must be a non-empty list")
    if "input" in j:
        _check_keys(j["input"], ["shape", "dtype"], source + ": input")
        s.input_shape = _get(j["input"], "shape", s.input_shape or [], "ints", source + ": input")
        if not s.input_shape:
            fail(source, ": input.shape must list the sample dims, e.g. [784] or [1, 28, 28]")
        if any(d <= 0 for d in s.input_shape):
            fail(source, ": input.shape ", s.input_shape, " has a non-positive dim")
        s.input_dtype = _get(j["input"], "dtype", "i32" if s.gpt else "f32", "str", source + ": input")
        if s.input_dtype not in ("f32", "i32"):
            _unknown(source + ": input", "dtype", s.input_dtype, ["f32", "i32"])
    s.classes = _get(j, "classes", s.gpt["vocab"] if s.gpt else 10, "int", source)
    s.batch_size = _get(j, "batch_size", 128, "int", source)
    s.epochs = _get(j, "epochs", 10, "int", source)
    s.seed = _get(j, "seed", 0, "int", source)
    s.device = _get(j, "device", "auto", "str", source)
    if s.device not in ("auto", "cpu", "cuda"):
        _unknown(source, "device", s.device, ["auto", "cpu", "cuda"])
    s.precision = _get(j, "precision", "f32", "str", source)
    if s.precision not in PRECISIONS:
        _unknown(source, "precision", s.precision, PRECISIONS)
    s.master_weights = _get(j, "master_weights", True, "bool", source)
    s.layout = _get(j, "layout", "auto", "str", source)
    if s.layout not in ("auto", "nchw", "nhwc"):
        _unknown(source, "layout", s.layout, ["auto", "nchw", "nhwc"])
    if s.batch_size < 1:
        fail(source, ": batch_size must be >= 1")
    if s.epochs < 1:
        fail(source, ": epochs must be >= 1")
    if "loss" in j:
        w = source + ": loss"
        _check_keys(j["loss"], ["op", "label_smoothing"], w)
        op = _get(j["loss"], "op", "cross_entropy", "str", w)
        if op != "cross_entropy":
            _unknown(w, "loss", op, ["cross_entropy"])
        s.label_smoothing = _get(j["loss"], "label_smoothing", 0.0, "float", w)
    s.optimizer = _parse_optimizer(j["optimizer"], source + ": optimizer") if "optimizer" in j else Optimizer()
    if "data" in j:
        w = source + ": data"
        _check_keys(j["data"], ["val_split", "augment", "tokens"], w)
        s.val_split = _get(j["data"], "val_split", 0.0, "float", w)
        if not 0 <= s.val_split < 1:
            fail(source, ": data.val_split must be in [0, 1)")
        if "augment" in j["data"]:
            a, w = j["data"]["augment"], source + ": data.augment"
            if not isinstance(a, dict):
                fail(w, ": must be an object, e.g. {\"crop_padding\": 2, \"horizontal_flip\": true}")
            _check_keys(a, ["crop_padding", "horizontal_flip"], w)
            s.crop_padding = _get(a, "crop_padding", 0, "int", w)
            s.horizontal_flip = _get(a, "horizontal_flip", False, "bool", w)
            if s.crop_padding < 0:
                fail(w, ": crop_padding must be >= 0, got ", s.crop_padding)
            if len(s.input_shape) != 3:
                fail(w, ": augmentation crops and flips images; input.shape ", s.input_shape,
                     " is not [channels, height, width]")
    return s


_GPT = {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab": 256, "padded_vocab": 0, "block_size": 256,
        "dropout": 0.0, "tie_weights": True, "ln_eps": 1e-5}


def _parse_gpt(m, where):
    """model_file.cpp's parse_gpt: the settings of nn::GptConfig, checked as validate() does."""
    if not isinstance(m, dict):
        fail(where, ": must be an object, e.g. {\"type\": \"gpt\", \"n_layer\": 6, ...}")
    if _get(m, "type", "", "str", where) != "gpt":
        _unknown(where, "model type", m.get("type", ""), ["gpt"])
    _check_keys(m, ["type"] + list(_GPT), where)
    kinds = {bool: "bool", int: "int", float: "float"}
    c = {k: _get(m, k, v, kinds[type(v)], where) for k, v in _GPT.items()}
    for k in ("n_layer", "n_head", "n_embd", "vocab", "block_size"):
        if c[k] < 1:
            fail(where, ": gpt: ", k, " must be >= 1, got ", c[k])
    if c["n_embd"] % c["n_head"]:
        fail(where, ": gpt: n_embd ", c["n_embd"], " is not divisible by n_head ", c["n_head"])
    if c["padded_vocab"] and c["padded_vocab"] < c["vocab"]:
        fail(where, ": gpt: padded_vocab ", c["padded_vocab"], " is smaller than vocab ", c["vocab"])
    if not 0 <= c["dropout"] < 1:
        fail(where, ": gpt: dropout must be in [0, 1), got ", c["dropout"])
    return c


def gpt_nodes(c):
    """nn::gpt (src/nn.cpp) as the entries of a 'nodes' model file: the same ops, in the same
    order, with the same parameter names."""
    C, H, T = c["n_embd"], c["n_head"], c["block_size"]
    D, rows = C // H, c["padded_vocab"] or c["vocab"]
    out = []

    def node(name, op, inputs, **attrs):
        out.append(dict(op=op, name=name, inputs=inputs if isinstance(inputs, list) else [inputs], **attrs))
        return name

    def drop(name, x):
        return node(name, "dropout", x, p=c["dropout"]) if c["dropout"] > 0 else x

    x = node("wte", "embedding", "x", num=rows, dim=C)
    x = drop("emb_drop", node("wpe", "position_embedding", x, num=T))
    for l in range(c["n_layer"]):
        h = f"h.{l}"
        a = node(f"{h}.ln_1", "layer_norm", x, eps=c["ln_eps"])
        a = node(f"{h}.attn.c_attn", "linear", a, out=3 * C)
        a = node(f"{h}.attn.split", "reshape", a, shape=[-1, T, 3, H, D])
        a = node(f"{h}.attn.sdpa", "attention_qkv", a, causal=1, dropout=c["dropout"])
        a = node(f"{h}.attn.merge", "reshape", a, shape=[-1, T, C])
        a = drop(f"{h}.attn.drop", node(f"{h}.attn.c_proj", "linear", a, out=C))
        x = node(f"{h}.res_1", "add", [x, a])
        m = node(f"{h}.ln_2", "layer_norm", x, eps=c["ln_eps"])
        m = node(f"{h}.mlp.gelu", "gelu_tanh", node(f"{h}.mlp.c_fc", "linear", m, out=4 * C))
        m = drop(f"{h}.mlp.drop", node(f"{h}.mlp.c_proj", "linear", m, out=C))
        x = node(f"{h}.res_2", "add", [x, m])
    x = node("ln_f", "layer_norm", x, eps=c["ln_eps"])
    x = node("lm_head", "linear", x, out=rows, bias=False, **({"tie": "wte"} if c["tie_weights"] else {}))
    if rows != c["vocab"]:
        x = node("logits", "slice", x, axis=2, start=0, end=c["vocab"])
    return out


def _to_attr(v, like, where, key):
    """model_file.cpp's to_attr: a JSON value as an attribute of the default's type."""
    kind = like.kind if isinstance(like, Req) else type(like)
    bad = lambda: fail(where, ": '", key, "' must be a ", {int: "int", float: "float", list: "int list",
                                                          str: "string"}[kind], ", got ", json.dumps(v))
    if kind is int:
        if isinstance(v, bool):
            return int(v)
        if not isinstance(v, int):
            bad()
        return v
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            bad()
        return float(v)
    if kind is list:
        if isinstance(v, int) and not isinstance(v, bool):
            n = 0 if isinstance(like, Req) else len(like)
            return [v] * (n or 2)
        if not isinstance(v, list) or any(not isinstance(e, int) or isinstance(e, bool) for e in v):
            bad()
        return list(v)
    if not isinstance(v, str):
        bad()
    return v


@dataclasses.dataclass
class Node:
    index: int
    op: str
    name: str
    inputs: list
    attrs: dict
    where: str
    layer: bool = False
    precision: str = None   # the entry's own "precision", if any
    module: object = None   # a layer's parameters


def parse_nodes(model):
    """The entries of a model file as Nodes with their operands named and attributes complete."""
    out, names = [], {"x"}
    prev = "x"
    for i, L in enumerate(model.layers):
        where = f"{model.source}: layer {i}"
        if not isinstance(L, dict) or not isinstance(L.get("op"), str):
            fail(where, ": needs \"op\": \"<name>\"")
        op = L["op"]
        name = _get(L, "name", "", "str", where)
        if name:
            where += f" ('{name}')"
        where += " " + op
        if not name:
            name = op + str(i)
        if name in names:
            fail(where, ": the name '", name, "' is used twice")
        layer = op in LAYERS
        if layer:
            allowed = NODE_KEYS + LAYERS[op]
        else:
            if op not in SCHEMAS or "_grad" in op:
                known = [k for k in SCHEMAS if "_grad" not in k] + [k for k in LAYERS if k not in SCHEMAS]
                _unknown(where[:where.rfind(" ")], "op", op, known)
            allowed = NODE_KEYS + list(SCHEMAS[op][1])
        _check_keys(L, allowed, where)
        if "input" in L and "inputs" in L:
            fail(where, ": give \"input\" (one name) or \"inputs\" (a list), not both")

        def operand(r, one):
            if not isinstance(r, str):
                fail(where, ": 'input' must be a node name" if one else ": 'inputs' must be a list of node names")
            if r not in names:
                _unknown(where, "input", r, sorted(names))
            return r

        if "input" in L:
            ins = [operand(L["input"], True)]
        elif "inputs" in L:
            if not isinstance(L["inputs"], list):
                fail(where, ": 'inputs' must be a list of node names")
            ins = [operand(r, False) for r in L["inputs"]]
        elif not model.sequential and i > 0:
            fail(where, ": a node of a 'nodes' graph needs \"inputs\" (or \"input\" for one)")
        else:
            ins = [prev]
        if not ins:
            fail(where, ": needs at least one input")
        precision = None
        if "precision" in L:
            precision = _get(L, "precision", "", "str", where)
            if precision not in PRECISIONS:
                _unknown(where, "precision", precision, PRECISIONS)
            if precision == "tf32":
                fail(where, ": precision override '", name, "': tf32 is a policy for a whole model's f32 GEMMs and "
                     "convolutions; a node or layer takes f32, bf16 or f16")
            if precision in LOW and op in F32_OPS | KEEP_OPS:
                fail(where, ": precision override '", name, "' (", precision, "): ", op, " node computes in ",
                     "f32 at every precision" if op in F32_OPS else "the dtypes it was given")
        if layer:
            if len(ins) != 1:
                fail(where, ": takes one input")
            attrs = _layer_attrs(op, L, where)
        else:
            if op in UNREACHABLE:
                fail(where, ": ", op, " cannot be used in a model file: ", UNREACHABLE[op])
            spec_in, spec_attrs = SCHEMAS[op]
            required = sum(1 for s in spec_in if not s.endswith("?") and not s.endswith("..."))
            variadic = any(s.endswith("...") for s in spec_in)
            if not (len(ins) >= max(required, 1) if variadic else required <= len(ins) <= len(spec_in)):
                fail(where, ": ", op, " node '", name, "': takes ", op, "(", ", ".join(spec_in), "), got ",
                     len(ins), " input(s)")
            if "training" in L:
                fail(where, ": 'training' is set by the mode a program is compiled in (train or eval), "
                     "not by the model file")
            if op in ("dropout", "attention", "attention_qkv") and "stream" in L:
                fail(where, ": 'stream' (which random stream the mask draws from) is the node's place in the "
                     "file, not a key")
            attrs = {}
            for k, d in spec_attrs.items():
                if k in L:
                    attrs[k] = _to_attr(L[k], d, where, k)
                elif isinstance(d, Req):
                    fail(where, ": ", op, " node '", name, "': attribute '", k, "' is required")
                else:
                    attrs[k] = list(d) if isinstance(d, list) else d
            if op in ("dropout", "attention", "attention_qkv"):
                attrs["stream"] = i  # the layer's index names its random stream
            if "training" in attrs:
                attrs["training"] = 1  # the mode pass's: a training step trains
        out.append(Node(i, op, name, ins, attrs, where, layer, precision))
        names.add(name)
        prev = name
    return out


def _layer_attrs(op, L, where):
    if op == "linear":
        if "tie" in L:  # another layer's weight, [out, in]; 'out' optional and checked against it
            return {"out": _get(L, "out", 0, "int", where) if "out" in L else None,
                    "bias": _get(L, "bias", True, "bool", where), "tie": _get(L, "tie", "", "str", where)}
        if "out" not in L:
            fail(where, ": 'out' (output features) is required")
        return {"out": _get(L, "out", 0, "int", where), "bias": _get(L, "bias", True, "bool", where), "tie": None}
    if op == "conv2d":
        if "out" not in L or "kernel" not in L:
            fail(where, ": 'out' and 'kernel' are required")
        pair = lambda k, d: _to_attr(L[k], d, where, k) if k in L else d
        k = pair("kernel", [1, 1])
        if len(k) != 2 or k[0] != k[1]:
            fail(where, ": only square kernels are supported by the conv2d layer")
        return {"out": _get(L, "out", 0, "int", where), "kernel": k[0], "stride": pair("stride", [1, 1]),
                "padding": pair("padding", [0, 0]), "dilation": pair("dilation", [1, 1]),
                "groups": _get(L, "groups", 1, "int", where), "bias": _get(L, "bias", True, "bool", where)}
    if op == "batch_norm":
        return {"momentum": _get(L, "momentum", 0.1, "float", where), "eps": _get(L, "eps", 1e-5, "float", where)}
    if op == "layer_norm":
        return {"eps": _get(L, "eps", 1e-5, "float", where)}
    return {"num": _get(L, "num", 0, "int", where), "dim": _get(L, "dim", 0, "int", where)}

