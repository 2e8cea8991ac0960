"""Crash-safe training: `seam train` killed with SIGKILL at random moments (while it loads
data, trains, evaluates or writes a checkpoint), then resumed from whatever checkpoint it
left, again and again until a run finishes. The finished run's metrics.csv must be
bitwise that of a run never interrupted (on the CPU), and every checkpoint a kill left
must load. Needs the seam binary in $SEAM_BIN and Debian's Fashion-MNIST.

SEAM_CRASH_DEVICE=cuda runs the same on the GPU (tools/device/run.sh crash), with
--deterministic so that an interrupted run can equal an uninterrupted one bit for bit;
SEAM_CRASH_DATA names the Fashion-MNIST folder where it is not Debian's."""
import csv
import os
import random
import signal
import subprocess
import time

import pytest

SEAM = os.environ.get("SEAM_BIN", "")
DEVICE = os.environ.get("SEAM_CRASH_DEVICE", "cpu")
DATA = os.environ.get("SEAM_CRASH_DATA", "/usr/share/datasets/fashion-mnist")
pytestmark = [
    pytest.mark.skipif(not SEAM or not os.path.exists(SEAM), reason="SEAM_BIN is not set to a seam binary"),
    pytest.mark.skipif(not os.path.isdir(DATA), reason=f"no Fashion-MNIST at {DATA} (tools/setup.sh installs it)"),
]

ARGS = ["train", "--epochs", "4", "--limit-train", "2048", "--limit-test", "500", "--device", DEVICE, "--data", DATA,
        "--quiet", *(["--deterministic"] if DEVICE == "cuda" else [])]
# What a run computes, not how fast: every column but the timings.
TIMING = {"epoch_seconds", "samples_per_second", "tokens_per_second", "mfu"}


def metrics(out):
    with open(os.path.join(out, "metrics.csv")) as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


def run(out, resume):
    cmd = [SEAM, *ARGS, "--out", out]
    ckpt = os.path.join(out, "checkpoint.safetensors")
    if resume and os.path.exists(ckpt):
        cmd += ["--resume", ckpt]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_killed_runs_resume_to_the_uninterrupted_result(tmp_path):
    # Two uninterrupted runs: the first fills the caches (compiled kernels; on the GPU
    # also the libraries' start-up), so the second's timeline is that of the runs killed
    # below, and the kill moments are drawn from it. Both must agree.
    for name in ("cold", "ref"):
        ref = str(tmp_path / name)
        start = time.monotonic()
        p = run(ref, resume=False)
        # When the first checkpoint appears: on the GPU most of a short run is start-up,
        # and kills drawn over the whole run would mostly land before there is anything to
        # resume from.
        first = None
        while p.poll() is None:
            if first is None and os.path.exists(os.path.join(ref, "checkpoint.safetensors")):
                first = time.monotonic() - start
            time.sleep(0.002)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        full = time.monotonic() - start
    first = first if first is not None else full / 4
    want = metrics(ref)
    assert len(want) == 4
    assert metrics(str(tmp_path / "cold")) == want

    rng = random.Random(20261202)
    kills = resumed = 0
    for trial in range(8):
        out = str(tmp_path / f"trial{trial}")
        resume = False
        for attempt in range(20):
            p = run(out, resume)
            if attempt < 6 and rng.random() < 0.8:
                # a quarter of the kills before the first checkpoint, the rest after it and
                # before the run's last tenth (a kill there finds it often finished)
                time.sleep(rng.uniform(0, first) if rng.random() < 1 / 4 else
                           rng.uniform(first, first + 0.9 * (full - first)))
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    kills += 1
            _, err = p.communicate(timeout=300)
            if p.returncode == 0:
                break
            # A kill after the last checkpoint but before the exit leaves a finished run,
            # which a resume refuses by name; its metrics must be whole all the same.
            if resume and p.returncode == 1 and b"the run already finished" in err:
                p.returncode = 0
                break
            assert p.returncode == -signal.SIGKILL, err.decode()
            resumed += os.path.exists(os.path.join(out, "checkpoint.safetensors"))
            resume = True
        assert p.returncode == 0, f"trial {trial}: no run finished"
        assert metrics(out) == want, f"trial {trial}"
    assert kills >= 8 and resumed >= 4, (kills, resumed)


def test_sigterm_and_sigint_write_a_checkpoint_and_exit_cleanly(tmp_path):
    ref = str(tmp_path / "ref")
    p = run(ref, resume=False)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()
    want = metrics(ref)
    for sig in (signal.SIGTERM, signal.SIGINT):
        out = str(tmp_path / sig.name)
        p = run(out, resume=False)
        # once the first epoch's row is there, the run is inside its training loop
        csv_path = os.path.join(out, "metrics.csv")
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline:
            if os.path.exists(csv_path) and len(open(csv_path).read().splitlines()) >= 2:
                break
            time.sleep(0.002)
        p.send_signal(sig)  # three epochs of four are still to come
        _, err = p.communicate(timeout=300)
        assert p.returncode == 128 + sig, (sig.name, p.returncode, err.decode())
        assert "interrupted after step" in err.decode() and "--resume" in err.decode(), err.decode()
        p = run(out, resume=True)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        assert metrics(out) == want, sig.name
