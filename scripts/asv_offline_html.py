"""``cropbench asv-offline-html``, under the name this script had before it became a command."""

import sys

from cropbench.cli import main

if __name__ == "__main__":
    sys.exit(main(["asv-offline-html", *sys.argv[1:]]))
