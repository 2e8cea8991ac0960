"""The Python package (python/seam, the _seam module): graphs, models and programs from
Python; one training step equal bit for bit to the C++ one on the CPU; errors as
exceptions. Needs the built package (`pip install .`, or _seam on PYTHONPATH) and numpy;
skipped without them. The bitwise test needs the seam binary in $SEAM_BIN.
"""
import json
import math
import os
import subprocess

import pytest

np = pytest.importorskip("numpy")
seam = pytest.importorskip("seam")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SEAM = os.environ.get("SEAM_BIN", "")


def mlp(batch=8):
    g = seam.Graph()
    x, y = g.input("x", [batch, 12]), g.input("y", [batch], "i32")
    h = seam.relu(seam.nn.linear(x, 16, "fc1"))
    logits = seam.nn.linear(h, 3, "fc2")
    return g, x, y, logits, seam.cross_entropy(logits, y)


def test_the_version_is_the_packages_and_the_command_lines():
    from importlib.metadata import PackageNotFoundError, version

    try:
        assert seam.__version__ == version("seam")
    except PackageNotFoundError:  # the module on PYTHONPATH, not installed
        pass
    if SEAM:
        out = subprocess.run([SEAM, "--version"], capture_output=True, text=True).stdout
        assert out.splitlines()[0] == "seam " + seam.__version__


def test_a_graph_trains_and_reads_back_as_numpy():
    g, x, y, logits, loss = mlp()
    assert x.shape == [8, 12] and y.dtype == "i32" and logits.shape == [8, 3]
    model = seam.Model(g, seed=1, device="cpu")
    assert model.parameters == 12 * 16 + 16 + 16 * 3 + 3
    step = model.compile(loss=loss, optimizer=seam.AdamW(lr=0.05), outputs=[logits])
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 12)).astype(np.float32)
    ys = rng.integers(0, 3, 8).astype(np.int32)
    step.set_input("x", xs)
    step.set_input("y", ys)
    losses = []
    for _ in range(30):
        step.run()
        losses.append(float(step.read(loss.name)))
    assert losses[-1] < 0.25 * losses[0]
    out = step.read(logits.name)
    assert out.shape == (8, 3) and out.dtype == np.float32
    assert step.read_grad("fc1.weight").shape == (16, 12)
    assert "linear" in step.plan and "arena peak" in step.plan


def test_recomputation_and_a_memory_budget_are_compile_options():
    g = seam.Graph()
    x, y = g.input("x", [16, 12]), g.input("y", [16], "i32")
    h = seam.nn.linear(x, 24, "in")
    u = seam.gelu(seam.nn.linear(seam.nn.layer_norm(h, "ln"), 64, "fc"), tanh_approximation=True)
    loss = seam.cross_entropy(seam.nn.linear(seam.add(h, seam.nn.linear(u, 24, "proj")), 3, "head"), y)
    model = seam.Model(g, seed=1, device="cpu")
    kept = model.compile(loss=loss, optimizer=seam.AdamW(lr=0.05))
    again = model.compile(loss=loss, optimizer=seam.AdamW(lr=0.05), recompute=["gelu", "layer_norm"])
    recomputed = [line.split()[1] for line in again.plan.splitlines() if line.endswith("/recompute")]
    assert "/recompute" not in kept.plan and sorted(recomputed) == ["gelu_tanh", "layer_norm"], again.plan
    roomy = model.compile(loss=loss, optimizer=seam.AdamW(lr=0.05), memory_budget_gib=1.0)
    assert "memory budget 1024.00 MiB" in roomy.plan and "recomputing" not in roomy.plan
    with pytest.raises(seam.Error, match="memory budget of .* the model's own buffers"):
        model.compile(loss=loss, optimizer=seam.AdamW(lr=0.05), memory_budget_gib=1e-6)
    with pytest.raises(ValueError, match="memory_budget_gib must be a positive number"):
        model.compile(loss=loss, memory_budget_gib=0.0)
    with pytest.raises(seam.Error, match="unknown activation 'relu'"):
        model.compile(loss=loss, recompute=["relu"])
    # A bias-free head's 16 rows in 4 chunks: four fused losses, the same loss within rounding.
    g = seam.Graph()
    x, y = g.input("x", [16, 12]), g.input("y", [16], "i32")
    loss = seam.cross_entropy(seam.nn.linear(seam.tanh(seam.nn.linear(x, 24, "in")), 3, "head", bias=False), y)
    whole = seam.Model(g, seed=1, device="cpu").compile(loss=loss, optimizer=seam.AdamW(lr=0.05))
    chunked = seam.Model(g, seed=1, device="cpu").compile(loss=loss, optimizer=seam.AdamW(lr=0.05), output_chunks=4)
    assert chunked.plan.count("cross_entropy_with_grad") == 4 and whole.plan.count("cross_entropy_with_grad") == 1
    rng = np.random.default_rng(4)
    xs, ys = rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)
    losses = []
    for step in (whole, chunked):
        step.set_input("x", xs)
        step.set_input("y", ys)
        step.run()
        losses.append(float(step.read(loss.name)))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    with pytest.raises(ValueError, match="output_chunks must be at least 1"):
        seam.Model(g, seed=1, device="cpu").compile(loss=loss, output_chunks=0)


def test_outputs_read_back_in_the_graphs_dtype_whatever_was_stored():
    # Under bf16 the logits are stored in 16 bits; read() gives them as the graph made
    # them (f32), as many values as the shape says.
    g, x, y, logits, loss = mlp()
    xs, ys = np.random.default_rng(2).standard_normal((8, 12)).astype(np.float32), np.arange(8, dtype=np.int32) % 3
    out = {}
    for precision in ("f32", "bf16"):
        step = seam.Model(g, seed=1, device="cpu", precision=precision).compile(outputs=[logits], mode="eval")
        assert (f"bf16[8,3]" in step.plan) == (precision == "bf16")
        step.set_input("x", xs)
        step.run()
        out[precision] = step.read(logits.name)
        assert out[precision].dtype == np.float32 and out[precision].shape == (8, 3)
    np.testing.assert_allclose(out["bf16"], out["f32"], rtol=2e-2, atol=2e-2)


def test_deterministic_is_an_option_and_the_cpu_repeats_either_way():
    g, x, y, logits, loss = mlp()
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((8, 12)).astype(np.float32)
    ys = rng.integers(0, 3, 8).astype(np.int32)
    weights = []
    for deterministic in (False, True):
        step = seam.Model(g, seed=5, device="cpu", deterministic=deterministic).compile(
            loss=loss, optimizer=seam.AdamW(lr=0.05))
        step.set_input("x", xs)
        step.set_input("y", ys)
        for _ in range(5):
            step.run()
        weights.append(step.read_grad("fc1.weight").tobytes())
    assert weights[0] == weights[1]


def test_runs_from_cpp_equal_runs_from_python():
    # _run_many (bench/python_overhead.py's baseline) runs the same steps as run().
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((8, 12)).astype(np.float32)
    ys = rng.integers(0, 3, 8).astype(np.int32)
    logits_after = []
    for from_cpp in (False, True):
        g, x, y, logits, loss = mlp()
        step = seam.Model(g, seed=2, device="cpu").compile(loss=loss, optimizer=seam.SGD(lr=0.1), outputs=[logits])
        step.set_input("x", xs)
        step.set_input("y", ys)
        if from_cpp:
            assert step._run_many(5) > 0
        else:
            for _ in range(5):
                step.run()
        step.check()
        logits_after.append(step.read(logits.name))
    assert np.array_equal(logits_after[0], logits_after[1])


def test_wrong_inputs_raise_value_error_naming_them():
    g, x, y, logits, loss = mlp()
    step = seam.Model(g, device="cpu").compile(loss=loss)
    with pytest.raises(ValueError, match=r"input 'x' takes f32\[8,12\], got an array of shape \[8,11\]"):
        step.set_input("x", np.zeros((8, 11), np.float32))
    with pytest.raises(ValueError, match=r"input 'y' takes i32\[8\].*another dtype"):
        step.set_input("y", np.zeros(8, np.int64))
    with pytest.raises(ValueError, match="no input named 'z'"):
        step.set_input("z", np.zeros(1, np.float32))
    with pytest.raises(seam.Error, match="no gradient for 'nope'"):
        step.read_grad("nope")
    with pytest.raises(seam.Error, match="no output named 'nope'"):
        step.read("nope")
    # GPU reads (device="cuda") need a program on the GPU.
    with pytest.raises(seam.Error, match="runs on the CPU"):
        step.read(loss.name, device="cuda")
    with pytest.raises(seam.Error, match="runs on the CPU"):
        step.read_grad("fc1.weight", device="cuda")
    with pytest.raises(ValueError, match="device is 'cpu'.*got 'gpu'"):
        step.read(loss.name, device="gpu")


def test_seam_errors_are_seam_error(tmp_path):
    assert issubclass(seam.Error, RuntimeError)
    bad = tmp_path / "bad.json"
    bad.write_text('{"input": {"shape": [4]}, "layers": [{"op": "relu"')
    with pytest.raises(seam.Error, match="malformed JSON"):
        seam.load_model_file(str(bad))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"input": {"shape": [4]}, "classes": 2, "layers": [{"op": "lineer", "out": 2}]}))
    with pytest.raises(seam.Error, match="unknown op 'lineer'; did you mean 'linear'"):
        seam.load_model_file(str(unknown))
    g = seam.Graph()
    a, b = g.input("a", [2, 3]), g.input("b", [4, 5])
    with pytest.raises(seam.Error, match="matmul"):
        seam.matmul(a, b)


@pytest.mark.skipif(not SEAM or not os.path.exists(SEAM), reason="SEAM_BIN is not set to a seam binary")
def test_one_step_is_the_cli_step_bit_for_bit(tmp_path):
    """`seam step` and the same model file's step from Python, on the CPU: the same loss and
    gradients, bit for bit."""
    safetensors = pytest.importorskip("safetensors.numpy")
    path = os.path.join(ROOT, "examples", "fmnist_mlp.json")
    out = tmp_path / "step"
    subprocess.run([SEAM, "step", path, "--out", str(out), "--device", "cpu", "--batch", "16"], check=True,
                   capture_output=True)
    info = json.loads((out / "step.json").read_text())
    batch = safetensors.load_file(str(out / "batch.safetensors"))
    after = safetensors.load_file(str(out / "after.safetensors"))
    spec = seam.load_model_file(path)
    built = spec.build(16)
    model = seam.Model(built.graph, seed=info["seed"], device="cpu", precision=info["precision"])
    step = model.compile(loss=built.loss, optimizer=spec.optimizer, outputs=[built.logits])
    step.set_input("x", batch["x"])
    step.set_input("y", batch["y"])
    step.run()
    assert np.float32(step.read(built.loss.name)) == np.float32(info["loss"])
    for name in ("fc1.weight", "fc2.bias"):
        assert np.array_equal(step.read_grad(name), after["grad/" + name]), name


def test_every_public_function_and_class_has_a_docstring():
    import inspect

    def documented(obj):
        doc = (getattr(obj, "__doc__", None) or "").strip()
        if isinstance(obj, property) or inspect.isclass(obj) or inspect.ismodule(obj):
            return bool(doc)
        # nanobind's docstrings open with the signature; the text follows it.
        return len([line for line in doc.splitlines() if line.strip()]) >= 2

    missing = []
    for name in seam.__all__:
        obj = getattr(seam, name)
        members = vars(obj).items() if inspect.isclass(obj) else []
        missing += [name] if not documented(obj) else []
        missing += [f"{name}.{m}" for m, v in members if not m.startswith("_") and not documented(v)]
    missing += [f"nn.{m}" for m in dir(seam.nn) if not m.startswith("_") and not documented(getattr(seam.nn, m))]
    assert not missing, missing


def test_python_m_seam_runs_the_command_line():
    import sys

    r = subprocess.run([sys.executable, "-m", "seam", "--version"], capture_output=True, text=True)
    if "not installed with this package" in r.stderr:
        pytest.skip("the package was not installed by pip (no bin/seam beside it)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("seam 0.1.0"), r.stdout


def test_checkpoints_are_safetensors_and_a_bad_one_changes_nothing(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    g, x, y, logits, loss = mlp()
    model = seam.Model(g, seed=3, device="cpu")
    path = str(tmp_path / "m.safetensors")
    model.save(path)
    saved = st.load_file(path)
    assert np.array_equal(saved["fc1.weight"], model.read_param("fc1.weight"))
    other = seam.Model(g, seed=4, device="cpu")
    before = other.read_param("fc2.bias")
    other.load(path)
    assert np.array_equal(other.read_param("fc2.bias"), model.read_param("fc2.bias"))
    wrong = {k: v for k, v in saved.items() if k != "fc2.bias"}
    st.save_file(wrong, str(tmp_path / "wrong.safetensors"))
    third = seam.Model(g, seed=5, device="cpu")
    before = third.read_param("fc1.weight")
    with pytest.raises(seam.Error, match="fc2.bias"):
        third.load(str(tmp_path / "wrong.safetensors"))
    assert np.array_equal(third.read_param("fc1.weight"), before)


def test_train_runs_a_model_file_as_the_command_line(tmp_path):
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("no Fashion-MNIST (tools/setup.sh installs it)")
    out = tmp_path / "run"
    rc = seam.train(os.path.join(ROOT, "examples", "fmnist_mlp.json"), epochs=1, batch=64, device="cpu",
                    out=str(out), max_steps=5, quiet=True)
    assert rc == 0
    assert (out / "checkpoint.safetensors").exists()
    with pytest.raises(seam.Error, match="cannot open model file"):
        seam.train(str(tmp_path / "missing.json"), quiet=True)


def test_train_reports_progress_to_a_callback_or_tqdm(tmp_path, capfd):
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("no Fashion-MNIST (tools/setup.sh installs it)")
    model = os.path.join(ROOT, "examples", "fmnist_mlp.json")
    events = []
    rc = seam.train(model, epochs=2, batch=64, device="cpu", out=str(tmp_path / "a"), limit_train=1024,
                    progress=lambda *e: events.append(e))
    assert rc == 0
    per_epoch = 1024 // 64
    for epoch in (1, 2):
        mine = [e for e in events if e[0] == epoch]
        assert mine and all(e[1] == 2 and e[3] == per_epoch for e in mine), events
        done = [e[2] for e in mine]
        assert done == sorted(done) and done[-1] == per_epoch
        assert all(math.isfinite(e[4]) and 0 <= e[5] <= 1 for e in mine)
    pytest.importorskip("tqdm")
    capfd.readouterr()
    assert seam.train(model, epochs=1, batch=64, device="cpu", out=str(tmp_path / "b"), limit_train=1024) == 0
    err = capfd.readouterr().err
    assert "epoch 1/1" in err and f"{per_epoch}/{per_epoch}" in err and "loss=" in err, err


def test_torch_tensors_go_in_through_dlpack():
    torch = pytest.importorskip("torch")
    g, x, y, logits, loss = mlp()
    step = seam.Model(g, seed=1, device="cpu").compile(outputs=[logits], mode="eval")
    xs = torch.randn(8, 12)
    step.set_input("x", xs)
    step.run()
    a = step.read(logits.name)
    step.set_input("x", xs.numpy())
    step.run()
    assert np.array_equal(a, step.read(logits.name))


def test_the_example_script_trains_and_reports(tmp_path):
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("no Fashion-MNIST (tools/setup.sh installs it)")
    import sys

    script = os.path.join(ROOT, "examples", "python", "train_mlp.py")
    r = subprocess.run([sys.executable, script, "--epochs", "1", "--limit-train", "2048", "--device", "cpu", "--out",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "epoch 1: train loss" in r.stdout, r.stdout
