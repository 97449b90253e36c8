"""The Dify plugins as packages: ``scripts/dify_package.py`` builds each ``.difypkg`` and checks it as Dify would.

The ``dify`` CLI (a Go binary of dify-plugin-daemon) is on no registry this
project can reach, so the script replays its packager: the ignore rules
(go-git gitignore patterns, each on its own), the size limit, the manifest
schema, the declared files and the icons; plus the Marketplace's README and
privacy-policy rules. ``tests/test_dify_real.py`` loads the built packages with
the real SDK.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from dify_packager import packager

from reach_plugins.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "examples" / "dify_plugin"
NAMES = ("reach_tools", "reach_agent")


def with_litter(name: str, into: Path) -> Path:
    """A copy of plugin ``name`` as a developer's folder looks: a debug .env, bytecode, a wheel in wheels/."""
    folder = into / name
    shutil.copytree(PLUGINS / name, folder)
    (folder / ".env").write_text("INSTALL_METHOD=remote\nREMOTE_INSTALL_KEY=0f1e2d3c-secret\n")
    cache = folder / "provider" / "__pycache__"
    cache.mkdir()
    (cache / "reach.cpython-312.pyc").write_bytes(b"\x00" * 64)
    (folder / "main.pyc").write_bytes(b"\x00" * 16)
    (folder / "wheels").mkdir()
    (folder / "wheels" / "reach_plugins-0.1.0-py3-none-any.whl").write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    return folder


@pytest.mark.parametrize("name", NAMES)
def test_the_package_leaves_out_the_debug_key_and_bytecode_and_keeps_wheels(name: str, tmp_path: Path) -> None:
    """Built by the script's CLI: no .env, no __pycache__ or .pyc; wheels/ kept; every file Dify needs is in."""
    folder = with_litter(name, tmp_path / "src")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dify_package.py"), str(folder), "--out", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    package = Path(out.stdout.strip())
    with zipfile.ZipFile(package) as archive:
        names = set(archive.namelist())
        packed_manifest = yaml.safe_load(archive.read("manifest.yaml"))
    assert ".env" not in names and ".env.example" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], sorted(names)
    assert "wheels/reach_plugins-0.1.0-py3-none-any.whl" in names
    required = {"manifest.yaml", "main.py", "requirements.txt", "README.md", "PRIVACY.md", "_assets/icon.svg"}
    assert required <= names, required - names
    assert packed_manifest["privacy"] == "PRIVACY.md" and package.name == f"{name}-{packed_manifest['version']}.difypkg"
    declared = [*packed_manifest["plugins"].get("tools", []), *packed_manifest["plugins"].get("agent_strategies", [])]
    assert declared and set(declared) <= names


def test_a_shipped_wheel_is_installed_from_the_package_first(tmp_path: Path) -> None:
    """--wheel puts the wheel in wheels/ and --find-links=./wheels/ first in requirements.txt, the README's route."""
    wheel = tmp_path / "reach_plugins-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    package = packager.build(PLUGINS / "reach_tools", tmp_path / "dist", wheels=[wheel])
    files = packager.read_package(package)
    assert files[f"wheels/{wheel.name}"] == wheel.read_bytes()
    lines = files["requirements.txt"].decode().splitlines()
    assert lines[0] == "--find-links=./wheels/" and lines.count("--find-links=./wheels/") == 1
    assert any(line.startswith("dify_plugin>=0.9") for line in lines)
    assert (PLUGINS / "reach_tools" / "requirements.txt").read_text().splitlines()[0] != lines[0], "source untouched"


def test_ignore_patterns_behave_as_the_dify_packager_applies_them() -> None:
    """go-git's rules: a bare name matches at any depth, / anchors, dir-only spares files, ! never re-includes."""
    parse = packager.Pattern.parse
    assert parse("__pycache__/").excludes(("tools", "__pycache__"), True)
    assert not parse("__pycache__/").excludes(("tools", "__pycache__"), False)
    assert parse("*.py[cod]").excludes(("provider", "reach.pyc"), False)
    assert not parse("*.py[cod]").excludes(("provider", "reach.py"), False)
    assert parse("/site").excludes(("site",), True) and not parse("/site").excludes(("docs", "site"), True)
    assert parse("docs/**/draft.md").excludes(("docs", "a", "b", "draft.md"), False)
    assert parse(".env").excludes((".env",), False) and not parse(".env").excludes((".env.example",), False)
    assert parse("wheels/").excludes(("wheels",), True), "the template's own line drops the README's wheels/"
    assert not parse("!wheels/").excludes(("wheels",), True), "a negation excludes nothing and re-includes nothing"


def test_the_example_plugins_keep_wheels_and_drop_the_env_file() -> None:
    """Both .difyignore files exclude .env and bytecode and list no pattern that would drop wheels/."""
    for name in NAMES:
        patterns = packager.ignore_patterns(PLUGINS / name)
        assert patterns, f"{name} has no .difyignore"
        assert any(p.excludes((".env",), False) for p in patterns)
        assert any(p.excludes(("tools", "__pycache__"), True) for p in patterns)
        assert not any(p.excludes(("wheels",), True) or p.excludes(("wheels", "x.whl"), False) for p in patterns)


def good_files(name: str) -> dict[str, bytes]:
    root = PLUGINS / name
    return {path: (root / path).read_bytes() for path in packager.packaged_files(root)}


def refused(files: dict[str, bytes], **options: int) -> str:
    with pytest.raises(ConfigError) as caught:
        packager.check(files, **options)
    return caught.value.message


def edited(files: dict[str, bytes], **changes: object) -> dict[str, bytes]:
    """``files`` with manifest.yaml's top-level keys changed (``None`` removes one)."""
    manifest = yaml.safe_load(files["manifest.yaml"])
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    return {**files, "manifest.yaml": yaml.safe_dump(manifest).encode()}


def test_the_checks_refuse_what_dify_or_its_marketplace_refuses() -> None:
    """Each rule of the packager, the daemon or the Marketplace that a package can break is reported by name."""
    tools, agent = good_files("reach_tools"), good_files("reach_agent")
    assert packager.check(tools)["name"] == "reach_tools" and packager.check(agent)["name"] == "reach_agent"
    assert "'privacy' must name the privacy policy" in refused(edited(tools, privacy=None))
    assert "which the package does not contain" in refused({k: v for k, v in tools.items() if k != "PRIVACY.md"})
    assert "README.md is missing" in refused({k: v for k, v in tools.items() if k != "README.md"})
    assert "English only" in refused({**tools, "README.md": "## Reach\n由其他 Agent 应答\n".encode()})
    assert "icon 'icon.svg' is not in _assets/" in refused({k: v for k, v in tools.items() if k != "_assets/icon.svg"})
    assert "tag 'agents' is not one of" in refused(edited(tools, tags=["agents"]))
    assert "name 'Reach Tools' must match" in refused(edited(tools, name="Reach Tools"))
    assert "version '0.1' must match" in refused(edited(tools, version="0.1"))
    assert "'created_at' is required" in refused(edited(tools, created_at=None))
    both = edited(agent, plugins={"agent_strategies": ["provider/reach_agent.yaml"], "tools": ["provider/reach.yaml"]})
    assert "agent_strategies cannot be declared with" in refused({**tools, **both})
    assert "tools/ask_agent.yaml is declared but not in the package" in refused(
        {k: v for k, v in tools.items() if k != "tools/ask_agent.yaml"}
    )
    assert "over 1024" in refused(tools, max_size=1024)
