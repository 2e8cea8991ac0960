"""python -m seam ARGS...: the seam command line (the binary installed with the package)."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "seam")
    if not os.path.exists(exe):
        sys.exit(f"seam: the command-line program is not installed with this package ({exe})")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
