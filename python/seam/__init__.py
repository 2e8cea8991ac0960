"""seam: compiles a network's whole training step (forward, loss, backward, optimizer
update) into one plan and runs it, on the CPU or an NVIDIA GPU.

    import numpy as np, seam
    g = seam.Graph()
    x, y = g.input("x", [32, 784]), g.input("y", [32], "i32")
    h = seam.relu(seam.nn.linear(x, 256, "fc1"))
    loss = seam.cross_entropy(seam.nn.linear(h, 10, "fc2"), y)
    model = seam.Model(g, seed=0, device="cpu")
    step = model.compile(loss=loss, optimizer=seam.AdamW(lr=1e-3))
    step.set_input("x", np.random.randn(32, 784).astype(np.float32))
    step.set_input("y", np.random.randint(0, 10, 32).astype(np.int32))
    step.run()
    print(step.read(loss.name))

A seam error is a seam.Error (a RuntimeError) with seam's message; a wrong input dtype
or shape is a ValueError naming the input, what it takes and what was given.
"""
import os
import subprocess
import sys


def _choose_blas_kernels():
    """OpenBLAS picks its kernels when it is loaded, and under hypervisors that report an
    unknown CPU model it falls back to generic ones about 6x slower (src/backend/cpu/gemm.h).
    The CLI then runs itself again with OPENBLAS_CORETYPE set; a module cannot, so a child
    interpreter loads it once to ask, and the variable is set before this process loads
    it. The same kernels give the CLI's results bit for bit."""
    if "OPENBLAS_CORETYPE" in os.environ or os.environ.get("SEAM_BLAS_PROBE") or not sys.platform.startswith("linux"):
        return
    env = dict(os.environ, SEAM_BLAS_PROBE="1")
    probe = "import seam._seam as s; print(s._blas_core_override())"
    try:
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    core = r.stdout.strip() if r.returncode == 0 else ""
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core


_choose_blas_kernels()

from ._seam import __version__  # noqa: F401 (the build's version, as `seam --version`)
from ._seam import (Adam, AdamW, BuiltModel, Error, Graph, Init, Model, ModelFile, Optimizer, Program, SGD, Var,
                    abs, add, argmax, attention, attention_qkv, cuda_available, gemm_library, cross_entropy, div, dropout, erf, exp, flatten, gelu, linear, load_model_file,
                    log, log_softmax, matmul, mean, mse, mul, nn, permute, relu, reshape, sigmoid, silu, softmax, sqrt,
                    sub, sum, tanh, _train)

__all__ = ["Adam", "AdamW", "BuiltModel", "Error", "Graph", "Init", "Model", "ModelFile", "Optimizer", "Program", "SGD",
           "Var", "abs", "add", "argmax", "attention", "attention_qkv", "cuda_available", "gemm_library", "cross_entropy", "div", "dropout", "erf", "exp", "flatten", "gelu", "linear",
           "load_model_file", "log", "log_softmax", "matmul", "mean", "mse", "mul", "nn", "permute", "relu", "reshape",
           "sigmoid", "silu", "softmax", "sqrt", "sub", "sum", "tanh", "train"]


def train(model_file, epochs=None, batch=None, lr=None, device=None, precision=None, data=None, out=None,
          resume=None, max_steps=0, limit_train=0, quiet=False, progress=None):
    """Trains a model file as `seam train` does: the epochs' lines on stdout, metrics.csv and
    checkpoints in `out` (default runs/<name>); returns the exit status (0, or 130 / 143
    when SIGINT / SIGTERM stopped it, after writing a checkpoint). The progress within an epoch is a tqdm bar where tqdm is installed (else
    seam's own bar on a terminal), or `progress(epoch, epochs, done, total, loss, accuracy)`
    if given. Raises seam.Error for a bad model file, data or option."""
    if progress is None and not quiet:
        progress = _tqdm_progress()
    return _train(model_file, epochs=epochs, batch=batch, lr=lr, device=device, precision=precision, data=data,
                  out=out, resume=resume, max_steps=max_steps, limit_train=limit_train, quiet=quiet, progress=progress)


def _tqdm_progress():
    """A progress callback drawing one tqdm bar an epoch, or None without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    bar = {}

    def update(epoch, epochs, done, total, loss, accuracy):
        if bar.get("epoch") != epoch:
            if bar.get("bar") is not None:
                bar["bar"].close()
            bar["bar"] = tqdm(total=total, desc=f"epoch {epoch}/{epochs}", unit="step")
            bar["epoch"] = epoch
        b = bar["bar"]
        b.update(done - b.n)
        b.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.4f}", refresh=done == total)
        if done == total:
            b.close()
            bar["bar"] = None

    return update

