"""The Twin: a seam model file as a torch.nn.Module, with seam's parameter names.

Building a Twin parses the file (parse.py), creates each layer's parameters with the
shapes, names and weight decay of seam's layers (src/nn.cpp; for a comparison their
values come from seam's init.safetensors), registers them at the module paths of their
seam names, and runs the graph once on meta tensors, so that a shape or dtype seam would
refuse is an error here too. forward() runs the nodes
with OPS (ops.py) under the model's precision; the ops call back into the Twin for a
node's parameters, its GEMM operands' dtype and dropout.
"""
import contextlib
import math

import torch
import torch.nn.functional as F

from .ops import OPS, _as_f32, philox_uniform
from .parse import _get, _unknown, load_model, parse_nodes
from .schema import DECAY_LAYERS, DTYPES, KINK_OPS, LOW, PRECISIONS, ModelFileError, fail


class Layer(torch.nn.Module):
    """One layer's parameters (weight, bias) and states (running_mean, running_var)."""


class Twin(torch.nn.Module):
    """seam's model file as a torch.nn.Module: forward(x) gives the logits, loss(logits, y)
    the loss. Parameters and states are named as seam names them (`seam_names`)."""

    def __init__(self, model, precision=None, dropout="torch", init_seed=0, reference=False):
        super().__init__()
        m = load_model(model)
        self.model_file = m
        self.precision = precision or m.precision
        if self.precision not in PRECISIONS:
            fail("unknown precision '", self.precision, "'")
        if dropout not in ("torch", "seam", "off"):
            fail("dropout must be torch, seam or off, got '", dropout, "'")
        self.dropout_mode = dropout
        self.seam_step = 0  # the step counter seam's dropout masks are drawn for
        self.probe = None  # a dict: forward keeps the operands of ReLUs, max pools, maxima there
        self.low = LOW.get(self.precision)
        self.reference = reference  # no layer's own precision: the float64 reference of check_step
        self.nodes = parse_nodes(m)
        self.output_name = _get(m.json, "output", self.nodes[-1].name, "str", m.source)
        known = {"x"} | {n.name for n in self.nodes}
        if self.output_name not in known:
            _unknown(m.source, "output", self.output_name, sorted(known))
        self.seam_names = {}   # state_dict key -> seam name
        self._torch_names = {}  # seam name -> state_dict key
        self.decay_names = set()  # seam names of the parameters weight decay applies to
        self._flat = None
        self._building = True
        self.has_conv = any(n.op == "conv2d" for n in self.nodes)
        self.input_shape = list(m.input_shape)
        self.classes = m.classes
        self.batch_size = m.batch_size
        self.label_smoothing = m.label_smoothing
        self._last_use = {}  # the last node that reads each value: forward drops it after
        for k, node in enumerate(self.nodes):
            for n in node.inputs:
                self._last_use[n] = k
        gen = torch.Generator().manual_seed(init_seed)
        values = {"x": torch.empty(2, *m.input_shape, device="meta", dtype=DTYPES[m.input_dtype])}
        for node in self.nodes:
            ins = [values[n] for n in node.inputs]
            if node.layer:
                self._make_layer(node, ins[0], gen)
            try:
                values[node.name] = self._run_node(node, ins)
            except ModelFileError:
                raise
            except (RuntimeError, ValueError, IndexError, TypeError) as e:
                fail(node.where, ": ", e)
        self._building = False
        out = values[self.output_name]
        if out.dim() < 2 or out.shape[0] != 2 or out.shape[-1] != m.classes:
            fail(m.source, ": the network's output is ", out.dtype, list(out.shape),
                 " but must be [batch, ..., classes] = [2, ..., ", m.classes, "]")

    # -- parameters -------------------------------------------------------------------

    def _make_layer(self, node, x, gen):
        a = node.attrs
        layer = Layer()
        uniform = lambda shape, fan_in: torch.nn.Parameter(
            (torch.rand(shape, generator=gen) * 2 - 1) / math.sqrt(max(fan_in, 1)))
        params = {}
        if node.op == "linear" and a["tie"] is not None:
            # seam's nn::linear_tied: the earlier layer's weight itself (one parameter, its
            # gradient the sum of both uses), kept out of this layer's parameters.
            fin = x.shape[-1] if x.dim() else 1
            src = next((n for n in self.nodes[:node.index] if n.name == a["tie"] and n.layer), None)
            w = getattr(src.module, "weight", None) if src is not None else None
            if w is None:
                fail(node.where, ": 'tie': no earlier layer '", a["tie"], "' with a weight")
            if a["out"] is not None and a["out"] != w.shape[0]:
                fail(node.where, ": 'out' = ", a["out"], " but the tied weight '", a["tie"], ".weight' is ",
                     list(w.shape))
            if w.dim() != 2 or w.shape[1] != fin:
                fail(node.where, ": the tied weight '", a["tie"], ".weight' is ", list(w.shape), ", this layer's input ",
                     "needs [out, ", fin, "]")
            object.__setattr__(layer, "weight", w)
            if a["bias"]:
                params["bias"] = uniform((w.shape[0],), fin)
        elif node.op == "linear":
            fin = x.shape[-1] if x.dim() else 1
            if a["out"] <= 0:
                fail(node.where, ": 'out' must be >= 1")
            params["weight"] = uniform((a["out"], fin), fin)
            if a["bias"]:
                params["bias"] = uniform((a["out"],), fin)
        elif node.op == "conv2d":
            if x.dim() != 4:
                fail(node.where, ": conv2d layer '", node.name, "': input ", list(x.shape), " is not [N, C, H, W]")
            if a["groups"] < 1 or x.shape[1] % a["groups"]:
                fail(node.where, ": groups=", a["groups"], " must divide C_in=", x.shape[1])
            cin, k = x.shape[1] // a["groups"], a["kernel"]
            params["weight"] = uniform((a["out"], cin, k, k), cin * k * k)
            if a["bias"]:
                params["bias"] = uniform((a["out"],), cin * k * k)
        elif node.op in ("batch_norm", "layer_norm"):
            if node.op == "batch_norm" and x.dim() < 2:
                fail(node.where, ": batch_norm layer '", node.name, "': input ", list(x.shape), " is not [N, C, ...]")
            c = x.shape[1] if node.op == "batch_norm" else x.shape[-1]
            params["weight"] = torch.nn.Parameter(torch.ones(c))
            params["bias"] = torch.nn.Parameter(torch.zeros(c))
            if node.op == "batch_norm":
                layer.register_buffer("running_mean", torch.zeros(c))
                layer.register_buffer("running_var", torch.ones(c))
        elif node.op == "position_embedding":
            if x.dim() != 3 or a["num"] < 1 or x.shape[1] > a["num"]:
                fail(node.where, ": position_embedding layer '", node.name, "': input ", list(x.shape),
                     " is not [B, T, C] with T <= num = ", a["num"])
            params["weight"] = torch.nn.Parameter(torch.randn(a["num"], x.shape[2], generator=gen) * 0.02)
        else:
            if x.dtype != torch.int32:
                fail(node.where, ": embedding ids must be i32")
            if a["num"] <= 0 or a["dim"] <= 0:
                fail(node.where, ": embedding needs num >= 1 and dim >= 1")
            params["weight"] = torch.nn.Parameter(torch.randn(a["num"], a["dim"], generator=gen))
        for k, p in params.items():
            layer.register_parameter(k, p)
            if k == "weight" and node.op in DECAY_LAYERS:
                self.decay_names.add(f"{node.name}.{k}")
        prefix = self._attach(node, layer)
        for k, _ in list(layer.named_parameters()) + list(layer.named_buffers()):
            self.seam_names[f"{prefix}.{k}"] = f"{node.name}.{k}"
            self._torch_names[f"{node.name}.{k}"] = f"{prefix}.{k}"
        node.module = layer

    def _attach(self, node, layer):
        """Registers a layer at the module path of its name ("layer1.0.conv1" is
        self.layer1[0].conv1), or, when the name cannot be one (an empty part, a part that
        is already an attribute or a parameter there), as _flat.l<index>; returns its
        state_dict prefix."""
        parts = node.name.split(".")
        owner = self
        ok = all(parts)
        for p in parts[:-1] if ok else []:
            child = owner._modules.get(p)
            if child is None:
                if hasattr(owner, p):
                    ok = False
                    break
                child = torch.nn.Module()
                owner.add_module(p, child)
            owner = child
        if ok:
            last = parts[-1]
            old = owner._modules.get(last)
            if old is None and not hasattr(owner, last):
                owner.add_module(last, layer)
                return node.name
            # A container made for a longer name ("a.b" before "a"): the layer takes its place.
            if type(old) is torch.nn.Module and not any(hasattr(layer, k) for k in old._modules):
                for k, v in old._modules.items():
                    layer.add_module(k, v)
                owner._modules[last] = layer
                return node.name
        if self._flat is None:
            self._flat = torch.nn.ModuleDict()
        self._flat[f"l{node.index}"] = layer
        return f"_flat.l{node.index}"

    def named_seam_parameters(self):
        for key, p in self.named_parameters():
            yield self.seam_names[key], p

    def seam_tensors(self):
        """{seam name: tensor} of every parameter and state."""
        sd = self.state_dict()
        return {self.seam_names[k]: v for k, v in sd.items() if k in self.seam_names}

    def load_seam_tensors(self, tensors, strict=True):
        """Copies seam's tensors (a safetensors dict) into the twin's parameters and states.
        Keys that are no model tensor (train.metrics, grad/..., logits, loss) are skipped;
        with strict, a missing tensor, an unknown one or a shape mismatch is an error."""
        own = dict(self.named_parameters())
        own.update(dict(self.named_buffers()))
        missing = [s for s in self._torch_names if s not in tensors]
        extra = [k for k in tensors if k not in self._torch_names and not k.startswith("grad/")
                 and k not in ("train.metrics", "logits", "loss")]
        if strict and (missing or extra):
            fail("seam's tensors and the twin's differ: missing ", missing, ", not in the twin ", extra)
        with torch.no_grad():
            for s, key in self._torch_names.items():
                if s not in tensors:
                    continue
                t = tensors[s]
                if list(t.shape) != list(own[key].shape):
                    fail("'", s, "' is ", list(t.shape), " in seam's tensors, ", list(own[key].shape), " in the twin")
                own[key].copy_(t.to(own[key].dtype))

    # -- forward ----------------------------------------------------------------------

    def forward(self, x):
        ctx = torch.autocast(x.device.type, dtype=self.low) if self.low is not None else contextlib.nullcontext()
        with ctx:
            values = {"x": x}
            for k, node in enumerate(self.nodes):
                values[node.name] = self._run_node(node, [values[n] for n in node.inputs])
                for n in node.inputs:
                    if self._last_use[n] == k and n != self.output_name:
                        values.pop(n, None)
            return values[self.output_name]

    def loss(self, logits, y):
        """The model file's loss: cross entropy (with its label smoothing) in fp32."""
        # A label per position ([B, T] against [B, T, V]): the mean over every label, as seam's.
        return F.cross_entropy(_as_f32(logits).reshape(-1, logits.shape[-1]), y.long().reshape(-1),
                               label_smoothing=self.label_smoothing)

    def _low_of(self, node):
        """The 16-bit dtype the node computes GEMMs in, or None."""
        if node.precision is not None and not self.reference:
            return LOW.get(node.precision)
        return self.low

    def _run_node(self, node, ins):
        if self.probe is not None and node.op in KINK_OPS:
            self.probe[node.name] = [t.detach() for t in ins]
        if self._building or node.precision is None or self.reference:
            return OPS[node.op](self, node, ins)
        dev = ins[0].device.type
        low = LOW.get(node.precision)
        with torch.autocast(dev, dtype=low) if low else torch.autocast(dev, enabled=False):
            return OPS[node.op](self, node, ins)

    def _gemm(self, node, ins):
        """A GEMM's operands: autocast casts them where the node computes in 16 bits; elsewhere
        16-bit operands read in f32 (seam's precision pass)."""
        if self._building or self._low_of(node) is not None:
            return ins
        return [_as_f32(t) for t in ins]

    def _param(self, node, k):
        p = getattr(node.module, k, None)
        if p is not None and self._building:
            return torch.empty(p.shape, device="meta", dtype=p.dtype)
        return p

    def _dropout(self, node, x, p=None):
        p = node.attrs["p"] if p is None else p
        if not 0 <= p < 1:
            fail(node.where, ": p must be in [0, 1), got ", p)
        if self._building or p == 0 or self.dropout_mode == "off":
            return x
        if self.dropout_mode == "torch":
            return F.dropout(x, p, training=True)
        u = philox_uniform(self.model_file.seed, self.seam_step, node.attrs["stream"], x.numel(), x.device)
        keep = (u >= p).reshape(x.shape)
        scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32).to(x.dtype).to(x.device)
        return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))

