"""Trains seam's default model (examples/fmnist_mlp.json, an MLP on Fashion-MNIST) from
Python and plots its loss curve, as a notebook would: `python examples/python/train_mlp.py`
after `pip install .`. The plot (loss.png beside metrics.csv) needs matplotlib and is
skipped without it.
"""
import argparse
import csv
import os

import seam

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=None, help="default: the model file's")
    p.add_argument("--limit-train", type=int, default=0, help="train on the first N images only")
    p.add_argument("--out", default="runs/fmnist_mlp_python")
    p.add_argument("--device", default="auto")
    a = p.parse_args()

    model_file = os.path.join(ROOT, "examples", "fmnist_mlp.json")
    spec = seam.load_model_file(model_file)
    print(f"{spec.name}: batch {spec.batch_size}, {spec.optimizer}")
    rc = seam.train(model_file, epochs=a.epochs, device=a.device, out=a.out, limit_train=a.limit_train)
    if rc != 0:
        raise SystemExit(rc)

    # The loss curve, from the metrics the trainer wrote after every epoch.
    with open(os.path.join(a.out, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    epochs = [int(r["epoch"]) for r in rows]
    train_loss = [float(r["train_loss"]) for r in rows]
    test_loss = [float(r["test_loss"]) for r in rows]
    for e, tr, te in zip(epochs, train_loss, test_loss):
        print(f"epoch {e}: train loss {tr:.4f}, test loss {te:.4f}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(epochs, train_loss, marker="o", label="train")
    ax.plot(epochs, test_loss, marker="o", label="test")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy")
    ax.set_title(spec.name)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(a.out, "loss.png")
    fig.savefig(path, dpi=120)
    print(f"loss curve: {path}")


if __name__ == "__main__":
    main()
