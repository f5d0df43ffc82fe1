"""``python -m peer ...``: run one client process (same flags as ``dfedrw peer``)."""

import sys

from peer.cli import main

if __name__ == "__main__":
    sys.exit(main(["peer", *sys.argv[1:]]))
