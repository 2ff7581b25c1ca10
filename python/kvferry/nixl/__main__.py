"""``python3 -m kvferry.nixl --shim-path``: prints the directory to put on PYTHONPATH so that
``import nixl`` finds kvferry's NIXL-compatible package."""

import sys

from . import shim_path

if __name__ == "__main__":
    if sys.argv[1:] != ["--shim-path"]:
        sys.exit("usage: python3 -m kvferry.nixl --shim-path")
    print(shim_path())
