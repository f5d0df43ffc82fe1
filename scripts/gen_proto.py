"""Regenerate the gRPC Python modules from proto/ (settings in pyproject.toml).

    python scripts/gen_proto.py            # write the generated files into the tree
    python scripts/gen_proto.py --out DIR  # write them under DIR instead (used by the test
                                           # that checks the committed files are current)
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate(out: Path) -> list[Path]:
    import shutil
    import tempfile

    from grpc_tools import protoc

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dfedrw"]["protoc"]
    proto_root = ROOT / settings["proto_root"]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in settings["sources"]:
        with tempfile.TemporaryDirectory() as tmp:
            args = [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(ROOT / source),
            ]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed on {source}")
            # dfedrw/peer/... is the import path; the package dfedrw.peer is the folder peer/.
            stem = Path(source).relative_to(settings["proto_root"]).with_suffix("")
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                target = out / Path(*stem.parts[1:]).with_name(stem.name + suffix)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(tmp) / f"{stem}{suffix}", target)
                written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or ROOT / tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dfedrw"]["protoc"]["out"]
    for path in generate(out):
        print(path.relative_to(out) if path.is_relative_to(out) else path)


if __name__ == "__main__":
    sys.exit(main())
