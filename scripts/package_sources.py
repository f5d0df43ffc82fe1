"""Print, one a line, the paths (relative to the repository) that the project's wheel is built
from, as pyproject.toml declares them: pyproject.toml itself, the readme, and the top-level
folder of every package in ``[tool.setuptools] packages`` mapped through ``package-dir``.

    python scripts/package_sources.py [REPO]

``scripts/build_wheelhouse.sh`` copies exactly these into its build tree. Standard library only.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path, PurePosixPath


def package_sources(repo: Path) -> list[str]:
    config = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config.get("tool", {}).get("setuptools", {})
    package_dir: dict[str, str] = setuptools.get("package-dir", {})
    packages: list[str] = setuptools.get("packages", [])
    if not isinstance(packages, list) or not packages:
        raise SystemExit("package_sources: pyproject.toml lists no [tool.setuptools] packages")
    folders: dict[str, None] = {}
    for package in packages:
        # The longest package-dir prefix decides where a package's files live.
        parts = package.split(".")
        for cut in range(len(parts), -1, -1):
            prefix = ".".join(parts[:cut])
            if prefix in package_dir or (cut == 0 and "" in package_dir):
                base = PurePosixPath(package_dir.get(prefix, "."))
                path = base.joinpath(*parts[cut:])
                break
        else:
            path = PurePosixPath(*parts)
        top = path.parts[0] if path.parts else "."
        if top in (".", ""):
            raise SystemExit(f"package_sources: package {package} maps to the repository root itself")
        if not (repo / path).is_dir():
            raise SystemExit(f"package_sources: package {package}: folder {path} does not exist")
        folders[top] = None
    readme = config.get("project", {}).get("readme")
    extra = [readme] if isinstance(readme, str) else []
    return ["pyproject.toml", *extra, *folders]


if __name__ == "__main__":
    print("\n".join(package_sources(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())))
