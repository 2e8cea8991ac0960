"""The command line of the twin: check_step for model files, or the list of ops (--ops).

Run as `python3 bench/torch_twin.py ...` (that file only calls main) or, from bench/,
`python3 -m twin ...`; its --help is the package's overview.
"""
import argparse
import os
import shutil
import sys

from . import __doc__ as OVERVIEW
from .check import check_step
from .schema import LAYERS, NO_GRADIENT, PRECISIONS, SCHEMAS, UNREACHABLE, ModelFileError


def default_seam():
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.environ.get("SEAM_BIN", ""), os.path.join(here, "..", "..", "build", "seam")):
        if p and os.path.exists(p):
            return p
    return shutil.which("seam") or "seam"


def main(argv=None):
    p = argparse.ArgumentParser(description=OVERVIEW, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="*", help="model file(s) (JSON)")
    p.add_argument("--ops", action="store_true", help="list every op of seam's model files and how the twin runs it")
    p.add_argument("--seam", default=None, help="the seam binary (default: $SEAM_BIN, build/seam, seam on PATH)")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help="default: the model file's")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--batch", type=int, default=None, help="default: the model file's")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--layout", choices=["auto", "nchw", "nhwc"], default=None)
    p.add_argument("--dropout", choices=["seam", "off"], default="seam",
                   help="seam: the twin draws seam's dropout masks; off: dropout p set to 0 on both sides")
    p.add_argument("--keep", default=None, help="keep seam step's files in this folder")
    p.add_argument("--steps", type=int, default=1,
                   help="also compare the loss curve over this many steps on the same batch")
    a = p.parse_args(argv)
    if a.ops:
        for op in sorted(set(SCHEMAS) | set(LAYERS)):
            how = ("unusable in a model file: " + UNREACHABLE[op] if op in UNREACHABLE else
                   "layer" if op in LAYERS else "no gradient" if op in NO_GRADIENT else "")
            print(f"{op:18s} {how}")
        return 0
    if not a.model:
        p.error("give a model file (or --ops)")
    if a.batch is not None and a.batch < 1:
        p.error("--batch must be >= 1")
    if a.steps < 1:
        p.error("--steps must be >= 1")
    seam = a.seam or default_seam()
    ok = True
    for path in a.model:
        try:
            r = check_step(seam, path, a.precision, a.device, a.batch, a.data_seed, a.dropout, a.layout,
                           keep_dir=a.keep, steps=a.steps)
            ok = ok and r.ok
        except (ModelFileError, RuntimeError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
