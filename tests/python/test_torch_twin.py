"""bench/twin/ against `seam step` on the CPU: the PyTorch twin of a model file
computes seam's first training step (loss, logits, gradients, running statistics, update)
and follows its loss curve over more steps.

Needs torch and safetensors (skipped without them) and the seam binary in $SEAM_BIN
(skipped without it). Not part of ctest: run `SEAM_BIN=build/seam pytest tests/python`.
"""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import twin as tt  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")
SEAM = os.environ.get("SEAM_BIN", "")
needs_seam = pytest.mark.skipif(not SEAM or not os.path.exists(SEAM), reason="SEAM_BIN is not set to a seam binary")


def check(model, precision="f32", batch=6, **kw):
    r = tt.check_step(SEAM, model, precision, "cpu", batch, **kw)
    assert r.ok, r.report()
    return r


@needs_seam
@pytest.mark.parametrize("name", ["fmnist_mlp", "fmnist_cnn", "fmnist_resnet"])
def test_examples_f32(name):
    r = check(os.path.join(EXAMPLES, name + ".json"))
    assert abs(r.torch_loss - r.seam_loss) <= 1e-5 * abs(r.seam_loss)


@needs_seam
def test_resnet18_f32():
    check(os.path.join(EXAMPLES, "resnet18_cifar.json"), batch=2)


@needs_seam
@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_cnn_16_bit(precision):
    check(os.path.join(EXAMPLES, "fmnist_cnn.json"), precision, batch=8)


@needs_seam
def test_dropout_masks_are_seams():
    # The twin draws seam's Philox masks: with dropout on, the loss is seam's to rounding.
    r = check(os.path.join(EXAMPLES, "fmnist_mlp.json"), batch=8)
    assert r.dropout == "seam"
    assert abs(r.torch_loss - r.seam_loss) <= 1e-6 * abs(r.seam_loss)
    off = check(os.path.join(EXAMPLES, "fmnist_mlp.json"), batch=8, dropout="off")
    assert off.dropout == "off" and off.seam_loss != r.seam_loss


@needs_seam
def test_state_dict_names_are_seams(tmp_path):
    path = os.path.join(EXAMPLES, "resnet18_cifar.json")
    tt.run_seam_step(SEAM, path, str(tmp_path), "f32", "cpu", 2)
    from safetensors.torch import load_file

    init = load_file(str(tmp_path / "init.safetensors"))
    twin = tt.Twin(path)
    assert set(twin.state_dict()) == set(init) - {"train.metrics"}
    twin.load_seam_tensors(init)
    assert twin.decay_names == {n for n in init if n.endswith(".weight") and "bn" not in n
                                and "downsample.1" not in n}


# -- every op a model file can use, against seam ------------------------------------------


def nodes(*entries):
    """(name, op, input or [inputs], {attributes}?) -> model-file entries."""
    out = []
    for name, op, src, *attrs in entries:
        out.append({"name": name, "op": op, ("inputs" if isinstance(src, list) else "input"): src,
                    **(attrs[0] if attrs else {})})
    return out


# Elementwise, reductions, shapes, softmax, norms, embedding, matmul, the fused ops and
# losses as nodes; Adam with clipping and a cosine schedule with min_lr.
OPS_A = {
    "name": "ops_a", "input": {"shape": [12]}, "classes": 4, "batch_size": 8, "seed": 3,
    "loss": {"op": "cross_entropy", "label_smoothing": 0.1},
    "optimizer": {"type": "adam", "lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01,
                  "clip_norm": 0.5, "schedule": {"type": "cosine", "total_steps": 10, "min_lr": 0.001}},
    "nodes": nodes(
        ("fc1", "linear", "x", {"out": 16}), ("a1", "leaky_relu", "fc1", {"alpha": 0.1}),
        ("fc2", "linear", "a1", {"out": 16, "bias": False}), ("s1", "sigmoid", "fc2"), ("t1", "tanh", "fc1"),
        ("g1", "gelu", "fc1"), ("g2", "gelu_tanh", "fc2"), ("si", "silu", "fc1"), ("m1", "mul", ["s1", "t1"]),
        ("ad", "add", ["g1", "g2"]), ("sb", "sub", ["ad", "si"]), ("mx", "maximum", ["m1", "sb"]),
        ("mn", "minimum", ["m1", "sb"]), ("sc", "scale", "mn", {"factor": 0.5}), ("e", "exp", "sc"),
        ("sq", "sqrt", "e"), ("lg", "log", "sq"), ("pw", "pow", "e", {"exponent": 1.5}), ("dv", "div", ["pw", "sq"]),
        ("ng", "neg", "dv"), ("h", "add", ["ng", "mx"]), ("h2", "add", ["h", "lg"]),
        ("ln", "layer_norm", "h2", {"eps": 1e-4}), ("bn", "batch_norm", "ln", {"momentum": 0.2}),
        ("dr", "dropout", "bn", {"p": 0.25}), ("sm", "softmax", "dr"), ("lsm", "log_softmax", "dr", {"axis": 1}),
        ("tot", "sum", "sm", {"axes": [1], "keepdims": 1}), ("avg", "mean", "lsm", {"axes": [-1], "keepdims": 1}),
        ("h3", "mul", ["lsm", "tot"]), ("h4", "sub", ["h3", "avg"]), ("r", "reshape", "h4", {"shape": [-1, 4, 4]}),
        ("tr", "transpose", "r", {"perm": [0, 2, 1]}), ("mm", "matmul", ["r", "tr"], {"transpose_b": 1}),
        ("mm2", "matmul", ["mm", "r"], {"transpose_a": 1}), ("fl", "flatten", "mm2"), ("cp", "copy", "fl"),
        ("cat", "concat", ["cp", "h2"], {"axis": 1}), ("sl", "slice", "cat", {"axis": 1, "start": 1, "end": -1,
                                                                              "step": 2}),
        ("xr", "reshape", "x", {"shape": [-1, 3, 4]}), ("ids", "argmax", "xr", {"axis": -1}),
        ("emb", "embedding", "ids", {"num": 4, "dim": 5}), ("embf", "flatten", "emb"),
        ("fc3", "linear", "embf", {"out": 15}), ("h5", "add", ["sl", "fc3"]), ("ln2", "layer_norm", "h5"),
        ("fc4", "linear", "ln2", {"out": 4}), ("wv", "mean", "h5", {"axes": [0], "keepdims": 1}),
        ("wb", "broadcast_to", "wv", {"shape": [3, 15]}), ("avg0", "mean", "wb", {"axes": [1]}),
        ("la", "linear_act", ["ln2", "wb"], {"act": "relu"}),
        ("la2", "linear_act_aux", ["ln2", "wb", "avg0"], {"act": "relu"}),
        ("lac", "concat", ["la", "la2"], {"axis": -1}), ("fc5", "linear", "lac", {"out": 4}),
        ("lab1", "slice", "ids", {"axis": 1, "start": 0, "end": 1}), ("lab", "reshape", "lab1", {"shape": [-1]}),
        ("ce", "cross_entropy", ["fc4", "lab"], {"label_smoothing": 0.2}), ("ms", "mse", ["fc4", "fc5"]),
        ("ida", "argmax", "fc4"), ("ce2", "count_equal", ["ida", "lab"]), ("cef", "cast", "ce2", {"dtype": "f32"}),
        ("fz", "fused_elementwise", ["fc4", "fc4"], {"program": "relu(i0);mul(t0,i1);scale[0.5](t1)->t2"}),
        ("out", "add", ["fc4", "fz"]), ("o2", "add", ["out", "ce"]), ("o3", "add", ["o2", "ms"]),
        ("o4", "add", ["o3", "cef"]), ("o5", "add", ["o4", "fc5"])),
}

# Convolutions (padding, dilation, groups, stride, with and without bias), batch norm,
# dropout of a 4-d value, both pools and their options; SGD with dampening, clipping, a
# step schedule with warmup; label smoothing.
OPS_B = {
    "name": "ops_b", "input": {"shape": [3, 9, 9]}, "classes": 5, "batch_size": 6, "seed": 11,
    "loss": {"op": "cross_entropy", "label_smoothing": 0.05},
    "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.001,
                  "clip_norm": 0.5, "schedule": {"type": "step", "step_size": 2, "gamma": 0.5, "warmup_steps": 3}},
    "layers": [
        {"op": "conv2d", "name": "c1", "out": 8, "kernel": 3, "padding": 1},
        {"op": "conv2d", "name": "c2", "out": 8, "kernel": [3, 3], "padding": 2, "dilation": 2, "groups": 2},
        {"op": "batch_norm", "name": "bn1", "eps": 1e-3, "momentum": 0.3},
        {"op": "relu"},
        {"op": "dropout", "p": 0.1},
        {"op": "max_pool2d", "name": "mp", "kernel": 3, "stride": 2, "padding": 1},
        {"op": "avg_pool2d", "name": "ap1", "kernel": 2, "stride": 1, "padding": 1, "count_include_pad": 0},
        {"op": "avg_pool2d", "name": "ap2", "kernel": [2, 2], "stride": [1, 1], "padding": [1, 1]},
        {"op": "conv2d", "name": "c3", "out": 6, "kernel": 3, "stride": 2, "bias": False},
        {"op": "silu"},
        {"op": "global_avg_pool", "name": "gap"},
        {"op": "linear", "name": "fc", "out": 5},
    ],
}

# Layers with "input" and "inputs", an "output" that is not the last layer (and a layer no
# gradient reaches), a layer's own precision, float -> int casts feeding an embedding;
# AdamW with a cosine schedule whose length comes from the run.
OPS_C = {
    "name": "ops_c", "input": {"shape": [2, 6, 6]}, "classes": 3, "batch_size": 5, "epochs": 3, "seed": 7,
    "output": "head", "precision": "bf16",
    "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.05, "clip_norm": 1.0,
                  "schedule": {"type": "cosine", "warmup_steps": 2}},
    "layers": [
        {"op": "flatten", "name": "f0", "start_dim": 2},
        {"op": "transpose", "name": "tp", "perm": [0, 2, 1]},
        {"op": "linear", "name": "proj", "out": 8, "precision": "f32"},
        {"op": "layer_norm", "name": "ln1"},
        {"op": "gelu"},
        {"op": "linear", "name": "proj2", "out": 8, "precision": "bf16"},
        {"op": "mean", "name": "pool", "axes": [1]},
        {"op": "sigmoid", "name": "sg", "input": "x"},
        {"op": "scale", "name": "sc", "factor": 6.99},
        {"op": "cast", "name": "ci", "dtype": "i32"},
        {"op": "reshape", "name": "cir", "shape": [-1, 72]},
        {"op": "slice", "name": "cis", "axis": 1, "start": 0, "end": 6},
        {"op": "embedding", "name": "emb", "num": 7, "dim": 4},
        {"op": "flatten", "name": "embf"},
        {"op": "linear", "name": "efc", "out": 8},
        {"op": "add", "name": "sum", "inputs": ["efc", "pool"]},
        {"op": "tanh"},
        {"op": "linear", "name": "head", "out": 3, "precision": "f32"},
        {"op": "linear", "name": "unused", "input": "pool", "out": 3},
    ],
}

# fused_elementwise programs (a layer norm, a sum over an axis, casts, gradient ops), casts
# to 16 bits inside an f32 model, channels-last pools, attention with dropout.
OPS_D = {
    "name": "ops_d", "input": {"shape": [8]}, "classes": 8, "batch_size": 6,
    "optimizer": {"type": "sgd", "lr": 0.1},
    "nodes": nodes(
        ("fc", "linear", "x", {"out": 8}),
        ("fz1", "fused_elementwise", ["fc", "fc"], {"program": "relu(i0);mul(t0,i1);scale[0.5](t1)->t2"}),
        ("g", "mean", "fc", {"axes": [0]}), ("b", "sum", "fz1", {"axes": [0]}),
        ("fz2", "fused_elementwise", ["fc", "fz1", "g", "b"],
         {"program": "add(i0,i1)->t0,layer_norm[1.0000000000000001e-05](t0,i2,i3)"}),
        ("sq", "sigmoid", "fc"),
        ("fz3", "fused_elementwise", ["fc", "sq"],
         {"program": "mul(i0,i0);sqrt_grad(t0,i1)->sum(t1)", "axes": [0], "keepdims": 1}),
        ("fz4", "fused_elementwise", ["fc", "fz2"],
         {"program": "cast[bf16](i0);tanh(t0);maximum_grad_a(t1,i0,i1);gelu_tanh_grad(t2,i1)->t3,t1"}),
        ("c16", "cast", "fc", {"dtype": "bf16"}), ("t16", "tanh", "c16"), ("c32", "cast", "t16", {"dtype": "f32"}),
        ("h", "add", ["fz2", "fz3"]), ("h2", "add", ["h", "fz4"]), ("h3", "add", ["h2", "c32"]),
        # attention with dropout of its probabilities, on two heads of two positions
        ("r4", "reshape", "fc", {"shape": [-1, 2, 2, 2]}), ("att", "attention", ["r4", "r4", "r4"], {"dropout": 0.3}),
        ("att2", "reshape", "att", {"shape": [-1, 8]}), ("h4", "add", ["h3", "att2"]),
        ("out", "linear", "h4", {"out": 8})),
}
OPS_E = {
    "name": "ops_e", "input": {"shape": [6, 6, 3]}, "classes": 3, "batch_size": 4,
    "layers": [
        {"op": "max_pool2d", "kernel": 2, "layout": "nhwc"},
        {"op": "avg_pool2d", "kernel": 2, "stride": 1, "padding": 1, "layout": "nhwc", "count_include_pad": 0},
        {"op": "exp"},
        {"op": "global_avg_pool", "layout": "nhwc"},
        {"op": "linear", "name": "fc", "out": 3},
    ],
}
# A GPT ("model": nn::gpt's nodes): token and position embeddings, causal attention on
# heads split and merged by permutes, GELU (tanh) MLPs, a padded vocabulary cut off the
# logits by a slice, dropout, the output projection tied to the token embedding.
OPS_F = {
    "name": "ops_f", "seed": 3, "batch_size": 3,
    "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16, "vocab": 50, "padded_vocab": 64,
              "block_size": 12, "dropout": 0.1},
    "optimizer": {"type": "adamw", "lr": 0.01, "betas": [0.9, 0.95], "weight_decay": 0.1, "clip_norm": 1.0,
                  "schedule": {"type": "cosine", "warmup_steps": 2}},
}
OP_MODELS = [OPS_A, OPS_B, OPS_C, OPS_D, OPS_E, OPS_F]


def write(tmp_path, model):
    path = tmp_path / (model["name"] + ".json")
    path.write_text(json.dumps(model))
    return str(path)


def ops_of(model):
    if "model" in model:
        return {e["op"] for e in tt.gpt_nodes(tt.load_model(model).gpt)}
    return {e["op"] for e in model.get("layers", model.get("nodes", []))}


def test_op_models_cover_every_model_file_op():
    used = set().union(*(ops_of(m) for m in OP_MODELS))
    assert set(tt.model_file_ops()) - used == set()


@needs_seam
def test_op_table_is_seams():
    listed = tt.seam_ops(SEAM)
    assert set(listed) - {"stop_gradient"} <= set(tt.SCHEMAS), "ops the twin does not know"
    for op, (inputs, attrs) in listed.items():
        assert list(attrs) == list(tt.SCHEMAS[op][1]), op
        assert [i.rstrip("?.") for i in inputs] == [i.rstrip("?.") for i in tt.SCHEMAS[op][0]], op


@needs_seam
@pytest.mark.parametrize("model", OP_MODELS, ids=lambda m: m["name"])
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_every_op(tmp_path, model, precision):
    check(write(tmp_path, model), precision, batch=None)


# -- the model file, without seam ----------------------------------------------------------


def test_names_that_are_no_module_path(tmp_path):
    m = {"input": {"shape": [4]}, "classes": 2,
         "layers": [{"op": "linear", "name": "a..b", "out": 3}, {"op": "linear", "name": "training", "out": 3},
                    {"op": "linear", "name": "head", "out": 2}]}
    twin = tt.Twin(write(tmp_path, dict(m, name="odd")))
    assert set(twin.seam_tensors()) == {"a..b.weight", "a..b.bias", "training.weight", "training.bias",
                                        "head.weight", "head.bias"}
    assert twin(torch.randn(3, 4)).shape == (3, 2)


@pytest.mark.parametrize("layers, message", [
    ([{"op": "lineer", "out": 2}], "unknown op 'lineer'; did you mean 'linear'?"),
    ([{"op": "linear", "out": 2, "inptus": "x"}], "unknown key 'inptus'"),
    ([{"op": "stop_gradient"}, {"op": "linear", "out": 2}], "unknown op 'stop_gradient'"),
    ([{"op": "full", "shape": [2]}, {"op": "linear", "out": 2}], "full cannot be used in a model file"),
    ([{"op": "linear", "out": 3}], "must be [batch, ..., classes]"),
    ([{"op": "scale"}, {"op": "linear", "out": 2}], "attribute 'factor' is required"),
    ([{"op": "linear", "out": 2, "precision": "tf32"}], "tf32 is a policy"),
    ([{"op": "softmax", "precision": "bf16"}, {"op": "linear", "out": 2}], "computes in f32 at every precision"),
    ([{"op": "add", "inputs": ["x"]}, {"op": "linear", "out": 2}], "got 1 input(s)"),
    ([{"op": "dropout", "p": 1.0}, {"op": "linear", "out": 2}], "p must be in [0, 1)"),
])
def test_model_file_errors(tmp_path, layers, message):
    with pytest.raises(tt.ModelFileError) as e:
        tt.Twin(write(tmp_path, {"name": "bad", "input": {"shape": [4]}, "classes": 2, "layers": layers}))
    assert message in str(e.value)


def test_schedule_is_seams():
    s = tt.Schedule("cosine", warmup_steps=4, total_steps=10, min_lr=0.1)
    assert [round(s.lr_at(1.0, k), 6) for k in (0, 3, 4, 9, 14, 20)] == [0.25, 1.0, 1.0, 0.55, 0.1, 0.1]
    s = tt.Schedule("step", step_size=2, gamma=0.5)
    assert [s.lr_at(1.0, k) for k in range(5)] == [1.0, 1.0, 0.5, 0.5, 0.25]


def test_decay_is_seams(tmp_path):
    # src/nn.cpp: linear, conv2d and embedding weights decay; biases and norm parameters never.
    b, c = tt.Twin(write(tmp_path, OPS_B)), tt.Twin(write(tmp_path, OPS_C))
    assert b.decay_names == {"c1.weight", "c2.weight", "c3.weight", "fc.weight"}
    assert c.decay_names == {"proj.weight", "proj2.weight", "emb.weight", "efc.weight", "head.weight", "unused.weight"}
    groups = tt.param_groups(b, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for n, p in b.named_seam_parameters() if n in b.decay_names}


def test_module_param_groups_decay_what_seam_decays():
    # compare_torch.py's W5 (torchvision's resnet18) splits its parameters by this rule.
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                            torch.nn.Linear(4, 2), torch.nn.LayerNorm(2), torch.nn.Embedding(5, 2))
    decay, rest = tt.module_param_groups(m, 5e-4)
    assert (decay["weight_decay"], rest["weight_decay"]) == (5e-4, 0.0)
    name = {id(p): n for n, p in m.named_parameters()}
    assert {name[id(p)] for p in decay["params"]} == {"0.weight", "3.weight", "5.weight"}
    assert {name[id(p)] for p in rest["params"]} == {"0.bias", "1.weight", "1.bias", "3.bias", "4.weight", "4.bias"}


@needs_seam
def test_compare_torch_gpt_is_seams_gpt(tmp_path):
    """bench/compare_torch.py's Gpt (W6's PyTorch side) computes seam's nn::gpt: seam's
    initial tensors loaded by name give seam's first-step loss."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compare_torch as ct
    from safetensors.torch import load_file

    cfg = dict(n_layer=2, n_head=2, n_embd=16, vocab=50, padded_vocab=64, block_size=12)
    path = write(tmp_path, {"name": "w6_tiny", "seed": 2, "batch_size": 3, "model": dict(type="gpt", **cfg)})
    info = tt.run_seam_step(SEAM, path, str(tmp_path / "step"), "f32", "cpu")
    init, batch = load_file(str(tmp_path / "step" / "init.safetensors")), load_file(str(tmp_path / "step" / "batch.safetensors"))
    model = ct.Gpt(**cfg).double()
    model.load_state_dict({k: v.double() for k, v in init.items() if k != "train.metrics"}, strict=True)
    loss = ct.loss_of(model, batch["x"], batch["y"].long())
    assert abs(loss.item() - info["loss"]) <= 1e-6 * abs(info["loss"])


@needs_seam
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_loss_curve_follows_the_twin(tmp_path, precision):
    # Ten steps on one batch: dropout's masks drawn for each step, the warmup and cosine
    # schedule, AdamW's moments and clipping all carried from step to step on both sides.
    r = tt.check_step(SEAM, write(tmp_path, OPS_F), precision, "cpu", None, steps=10)
    assert r.ok, r.report()
    seam, twin, ref = r.curve
    assert len(seam) == len(twin) == len(ref) == 10
    assert seam[-1] < seam[0] - 0.5, "the model learns its batch"
    if precision == "f32":
        assert max(abs(s - t) / t for s, t in zip(seam, twin)) <= 1e-5


def test_judge_curve_tells_a_mistake_from_drift():
    ref = [4.0 - 0.3 * i for i in range(10)]
    twin = [r + 0.02 * (-1) ** i for i, r in enumerate(ref)]
    drift = [r - 0.02 * (-1) ** i for i, r in enumerate(ref)]   # as far from exact as the twin, on the other side
    assert tt.judge_curve(drift, twin, ref, 1e-3).ok
    wrong = [r + 0.1 * i for i, r in enumerate(ref)]             # leaves the exact curve
    row = tt.judge_curve(wrong, twin, ref, 1e-3)
    assert not row.ok and "step 10" in row.where
    assert "largest distance from f64 seam 9.00e-01, torch 2.00e-02" in row.where
    assert tt.judge_curve(twin, twin, ref, 0.0).ok
    assert not tt.judge_curve(twin[:5], twin, ref, 1.0).ok
    diverged = twin[:7] + [float("nan")] + twin[8:]                # one step's loss not finite
    assert not tt.judge_curve(diverged, twin, ref, 1.0).ok


@pytest.mark.parametrize("model, message", [
    ({"n_head": 3}, "n_embd 8 is not divisible by n_head 3"),
    ({"heads": 2}, "unknown key 'heads'"),
    ({"padded_vocab": 5}, "padded_vocab 5 is smaller than vocab 11"),
    ({"type": "rnn"}, "unknown model type 'rnn'"),
])
def test_gpt_model_errors_are_seams(model, message):
    m = dict({"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab": 11, "block_size": 6}, **model)
    with pytest.raises(tt.ModelFileError, match=message):
        tt.load_model({"model": m})
