"""``cropbench headline``, under the name this script had before it became a command."""

import sys

from cropbench.cli import main

if __name__ == "__main__":
    sys.exit(main(["headline", *sys.argv[1:]]))
