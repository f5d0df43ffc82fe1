"""`dfedrw compose` with outside classes: their modules are copied into the folder and mounted
read-only on every service's PYTHONPATH."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

from dfedrw.experiments.cli import main
from dfedrw.launch.compose import write_compose
from dfedrw.launch.compose_plan import PLUGINS_DIR, PLUGINS_PATH
from dfedrw.peer.config.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "examples" / "plugins"


def _services(text: str) -> dict[str, str]:
    """The service blocks of a generated docker-compose.yml, by name (the file is written by
    hand in a fixed layout: two-space service names, four-space keys)."""
    blocks: dict[str, list[str]] = {}
    section, name = None, None
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            section, name = line.rstrip(":"), None
        elif section == "services" and line.startswith("  ") and not line.startswith("   ") and line.strip():
            name = line.strip().split(":")[0]
            blocks[name] = []
        elif name is not None:
            blocks[name].append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def test_outside_modules_are_copied_and_mounted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    scenario = load_scenario(PLUGINS / "scenario.toml")
    folder = write_compose(scenario, tmp_path / "cluster")

    copied = tmp_path / "cluster" / PLUGINS_DIR / "mylab_plugins.py"
    assert copied.read_bytes() == (PLUGINS / "mylab_plugins.py").read_bytes()
    assert sorted(p.name for p in (tmp_path / "cluster" / PLUGINS_DIR).iterdir()) == ["mylab_plugins.py"]
    services = _services((tmp_path / "cluster" / "docker-compose.yml").read_text())
    assert set(services) == {f"client-{k}" for k in range(10)} | {"summarize"}
    for name, block in services.items():
        assert f'- "./{PLUGINS_DIR}:{PLUGINS_PATH}:ro"' in block, name
        assert f'PYTHONPATH: "{PLUGINS_PATH}"' in block, name
    byzantine = [s.name for s in folder.services if s.byzantine]
    assert len(byzantine) == 2
    for name in byzantine:
        assert 'DFEDRW_ATTACK: "mylab_plugins:ScaledMean"' in services[name]
    assert "mylab_plugins:LowestK" in (tmp_path / "cluster" / "scenario.toml").read_text()
    assert f"`{PLUGINS_DIR}/`" in (tmp_path / "cluster" / "README.md").read_text()

    compose = shutil.which("docker-compose")
    if compose:  # as docker-compose reads it, where v2 is here (it prints JSON)
        run = subprocess.run([compose, "config", "--format", "json"], cwd=tmp_path / "cluster", capture_output=True, text=True, timeout=60)
        if run.returncode == 0 and run.stdout.lstrip().startswith("{"):
            for name, svc in json.loads(run.stdout)["services"].items():
                assert svc["environment"]["PYTHONPATH"] == PLUGINS_PATH, name
                mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}:{'ro' if v.get('read_only') else 'rw'}" for v in svc["volumes"]]
                assert f"{tmp_path / 'cluster' / PLUGINS_DIR}:{PLUGINS_PATH}:ro" in mounts, (name, mounts)


def test_outside_package_is_copied_whole_and_stale_modules_go(tmp_path, monkeypatch):
    package = tmp_path / "src" / "labpkg"
    (package / "attacks").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "attacks" / "__init__.py").write_text(
        "class Zero:\n"
        "    def __call__(self, received, receiver, generator):\n"
        "        return None if received.shape[0] == 0 else received[0] * 0\n"
    )
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "junk.pyc").write_bytes(b"x")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    out = tmp_path / "cluster"
    write_compose(load_scenario(None), out)  # written before, for an earlier scenario
    (out / PLUGINS_DIR).mkdir(parents=True)
    (out / PLUGINS_DIR / "old_module.py").write_text("")  # that scenario's module

    write_compose(load_scenario(None, ["attack.name=labpkg.attacks:Zero"]), out)
    assert (out / PLUGINS_DIR / "labpkg" / "attacks" / "__init__.py").is_file()
    assert not (out / PLUGINS_DIR / "labpkg" / "__pycache__").exists()
    assert sorted(p.name for p in (out / PLUGINS_DIR).iterdir()) == ["labpkg"]
    assert f'"./{PLUGINS_DIR}:{PLUGINS_PATH}:ro"' in (out / "docker-compose.yml").read_text()


def test_builtin_classes_only_no_plugins_folder(tmp_path):
    write_compose(load_scenario(None), tmp_path)
    assert not (tmp_path / PLUGINS_DIR).exists()
    assert "PYTHONPATH" not in (tmp_path / "docker-compose.yml").read_text()


def test_module_without_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    """A module this host imports but cannot copy (no file: here made so): one line, no folder."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mylab_plugins" else real(name, *a))
    out = tmp_path / "cluster"
    assert main(["compose", str(PLUGINS / "scenario.toml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dfedrw: compose: attack.name='mylab_plugins:ScaledMean'"), err
    assert "cannot find module 'mylab_plugins'" in err[0]
    assert not out.exists()


def test_list_shows_the_outside_attack(monkeypatch, capsys):
    """`dfedrw list attacks --plugin mylab_plugins:ScaledMean` describes the outside attack."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    assert main(["list", "attacks", "--plugin", "mylab_plugins:ScaledMean"]) == 0
    out = capsys.readouterr().out
    assert "mylab_plugins:ScaledMean" in out
    assert "factor" in out and "noise" in out
    assert "gaussian" in out  # the registered ones are listed too
