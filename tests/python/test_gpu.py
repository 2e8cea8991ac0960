"""GPU arrays in and out of a program through DLPack (torch CUDA tensors, no host round
trip), and a training run on the GPU against PyTorch's W1 model (bench/compare_torch.py).
Skipped without torch, a GPU, or a seam built with its CUDA backend; the GPU machine runs
them (tools/device/run.sh python).
"""
import os
import sys

import pytest

np = pytest.importorskip("numpy")
seam = pytest.importorskip("seam")
torch = pytest.importorskip("torch")
if not (torch.cuda.is_available() and seam.cuda_available()):
    pytest.skip("needs a GPU and seam's CUDA backend", allow_module_level=True)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def mlp(batch=8, width=16):
    g = seam.Graph()
    x, y = g.input("x", [batch, 12]), g.input("y", [batch], "i32")
    logits = seam.nn.linear(seam.relu(seam.nn.linear(x, width, "fc1")), 3, "fc2")
    return g, logits, seam.cross_entropy(logits, y)


def batch(seed, n=8):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def trained(feed, steps=4, precision="f32"):
    """Losses and fc1's weights after `steps` AdamW steps, each batch fed by feed(step, name, array)."""
    g, logits, loss = mlp()
    step = seam.Model(g, seed=3, device="cuda", precision=precision, deterministic=True).compile(
        loss=loss, optimizer=seam.AdamW(lr=0.05), outputs=[logits])
    losses = []
    for i in range(steps):
        xs, ys = batch(i)
        feed(step, "x", xs)
        feed(step, "y", ys)
        step.run()
        losses.append(step.read(loss.name))
    return np.array(losses), step.read_grad("fc1.weight"), step


def test_cuda_tensors_train_as_host_arrays_do_bit_for_bit():
    host, host_grad, _ = trained(lambda s, n, a: s.set_input(n, a))
    # Made on a side stream right before they go in: the program's copy must wait for it.
    side = torch.cuda.Stream()

    def from_torch(s, n, a):
        with torch.cuda.stream(side):
            t = torch.from_numpy(a).cuda(non_blocking=True) * 1  # a kernel on the side stream
            s.set_input(n, t)
        del t  # the program holds it until its copy has run

    dev, dev_grad, _ = trained(from_torch)
    assert np.array_equal(host, dev)
    assert np.array_equal(host_grad, dev_grad)


def test_outputs_and_gradients_read_on_the_gpu_equal_the_host_reads():
    for precision in ("f32", "bf16"):
        _, _, step = trained(lambda s, n, a: s.set_input(n, a), steps=2, precision=precision)
        for name in step.outputs:
            t = torch.from_dlpack(step.read(name, device="cuda"))
            assert t.is_cuda and t.device.index == torch.cuda.current_device()
            host = step.read(name)
            assert t.dtype == torch.from_numpy(host).dtype  # the graph's dtype, whatever was stored
            assert np.array_equal(t.cpu().numpy(), host), name
        g = torch.from_dlpack(step.read_grad("fc1.weight", device="cuda"))
        assert tuple(g.shape) == (16, 12)
        assert np.array_equal(g.cpu().numpy(), step.read_grad("fc1.weight"))
        # Each read is fresh memory: the next step does not change what was read.
        before = t.clone()
        step.run()
        step.check()
        assert torch.equal(t, before)


def test_conv_outputs_and_filter_gradients_read_on_the_gpu_in_nchw_order():
    # A convolution's output and filter gradient, which the layout pass may keep
    # channels-last at 16 bits: read on the GPU, they come back in NCHW order and the
    # graph's dtype, as the host reads them.
    g = seam.Graph()
    x, y = g.input("x", [4, 3, 8, 8]), g.input("y", [4], "i32")
    feat = seam.relu(seam.nn.conv2d(x, 16, 3, "conv", padding=[1, 1]))
    loss = seam.cross_entropy(seam.nn.linear(seam.flatten(feat), 5, "fc"), y)
    step = seam.Model(g, seed=2, device="cuda", precision="bf16").compile(
        loss=loss, optimizer=seam.SGD(lr=0.1), outputs=[feat])
    rng = np.random.default_rng(3)
    step.set_input("x", rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    step.set_input("y", rng.integers(0, 5, 4).astype(np.int32))
    step.run()
    on_gpu = torch.from_dlpack(step.read(feat.name, device="cuda"))
    assert tuple(on_gpu.shape) == (4, 16, 8, 8) and on_gpu.dtype == torch.float32
    assert np.array_equal(on_gpu.cpu().numpy(), step.read(feat.name))
    grad = torch.from_dlpack(step.read_grad("conv.weight", device="cuda"))
    assert tuple(grad.shape) == (16, 3, 3, 3)
    assert np.array_equal(grad.cpu().numpy(), step.read_grad("conv.weight"))


def test_bf16_values_travel_as_torch_bfloat16():
    g = seam.Graph()
    x, z = g.input("x", [4, 8], "bf16"), g.input("z", [4, 8], "bf16")
    out = seam.relu(x * z)
    step = seam.Model(g, seed=1, device="cuda").compile(outputs=[out], mode="eval")
    xt = torch.randn(4, 8, device="cuda").to(torch.bfloat16)
    zt = torch.randn(4, 8, device="cuda").to(torch.bfloat16)
    step.set_input("x", xt)
    step.set_input("z", zt)
    step.run()
    on_gpu = torch.from_dlpack(step.read(out.name, device="cuda"))
    assert on_gpu.dtype == torch.bfloat16
    assert torch.equal(on_gpu, torch.relu(xt * zt))  # one product, rounded once, either side
    bits = lambda t: t.cpu().view(torch.int16).numpy().view(np.uint16)  # numpy has no bf16: its bits
    assert np.array_equal(step.read(out.name), bits(on_gpu))
    step.set_input("x", bits(xt))
    step.set_input("z", bits(zt))
    step.run()
    assert np.array_equal(step.read(out.name), bits(on_gpu))


def test_wrong_gpu_inputs_raise_value_error_naming_them():
    g, logits, loss = mlp()
    step = seam.Model(g, device="cuda").compile(loss=loss)
    with pytest.raises(ValueError, match=r"input 'x' takes f32\[8,12\], got an array of shape \[8,11\]"):
        step.set_input("x", torch.zeros(8, 11, device="cuda"))
    with pytest.raises(ValueError, match=r"input 'x' takes f32\[8,12\].*another dtype"):
        step.set_input("x", torch.zeros(8, 12, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="input 'x': a GPU array must be contiguous"):
        step.set_input("x", torch.zeros(12, 8, device="cuda").t())
    with pytest.raises(ValueError, match="device is 'cpu'"):
        step.read(loss.name, device="gpu")
    cpu = seam.Model(g, device="cpu").compile(loss=loss)
    with pytest.raises(ValueError, match="input 'x': a GPU array, but this program runs on the CPU"):
        cpu.set_input("x", torch.zeros(8, 12, device="cuda"))
    with pytest.raises(seam.Error, match="runs on the CPU"):
        cpu.read(loss.name, device="cuda")


def test_w1_trains_from_torch_tensors_as_pytorch_does():
    """bench/compare_torch.py's W1 (784-1024-1024-10, ReLU, Adam 1e-3, batch 128) in strict
    f32 on both sides, from seam's initial weights, fed the same CUDA tensors."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import compare_torch

    spec = compare_torch.WORKLOADS["W1"]
    dims, n = spec["dims"], spec["batch"]
    g = seam.Graph()
    x, y = g.input("x", [n, dims[0]]), g.input("y", [n], "i32")
    h = x
    for i, width in enumerate(dims[1:]):
        h = seam.nn.linear(h, width, f"fc{i + 1}")
        if i + 2 < len(dims):
            h = seam.relu(h)
    loss = seam.cross_entropy(h, y)
    model = seam.Model(g, seed=7, device="cuda", precision="f32")
    step = model.compile(loss=loss, optimizer=seam.Adam(lr=spec["lr"]))

    torch.backends.cuda.matmul.allow_tf32 = False
    ref = compare_torch.Mlp(dims, spec["act"]).cuda()
    with torch.no_grad():
        for i, layer in enumerate(ref.layers):
            layer.weight.copy_(torch.from_numpy(model.read_param(f"fc{i + 1}.weight")))
            layer.bias.copy_(torch.from_numpy(model.read_param(f"fc{i + 1}.bias")))
    opt = torch.optim.Adam(ref.parameters(), lr=spec["lr"])

    gen = torch.Generator(device="cuda").manual_seed(0)
    ours, theirs = [], []
    for _ in range(20):
        xs = torch.randn(n, dims[0], device="cuda", generator=gen)
        ys = torch.randint(0, dims[-1], (n,), device="cuda", generator=gen, dtype=torch.int32)
        step.set_input("x", xs)
        step.set_input("y", ys)
        step.run()
        ours.append(float(step.read(loss.name)))
        opt.zero_grad()
        out = torch.nn.functional.cross_entropy(ref(xs), ys.long())
        out.backward()
        opt.step()
        theirs.append(out.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    # The last step's gradients, read on the GPU (the weights themselves are a weaker check:
    # Adam moves a weight whose gradient is near zero by about lr either way).
    for i, layer in enumerate(ref.layers):
        ours_g = torch.from_dlpack(step.read_grad(f"fc{i + 1}.weight", device="cuda")).cpu().numpy()
        theirs_g = layer.weight.grad.cpu().numpy()
        np.testing.assert_allclose(ours_g, theirs_g, rtol=0, atol=1e-3 * np.abs(theirs_g).max())
