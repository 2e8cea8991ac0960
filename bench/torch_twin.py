#!/usr/bin/env python3
"""The command line of bench/twin/, the PyTorch twin of a seam model file; see its __init__.py.

    python3 bench/torch_twin.py examples/fmnist_cnn.json --seam build/seam --batch 8
    python3 bench/torch_twin.py --ops     # every op of seam's model files and its twin

Kept at this path because the README, `seam`'s help for its step command and src/train/
name it; the code is the package's (`import twin` with bench/ on the path).
"""
import sys

from twin.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
