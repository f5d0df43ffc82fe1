"""``python -m dfedrw.peer ...``: run one client process (same flags as ``dfedrw peer``)."""

import sys

from dfedrw.peer.cli import main

if __name__ == "__main__":
    sys.exit(main(["peer", *sys.argv[1:]]))
