"""``cropbench gpu-table``, under the name this script had before it became a command."""

import sys

from cropbench.cli import main

if __name__ == "__main__":
    sys.exit(main(["gpu-table", *sys.argv[1:]]))
