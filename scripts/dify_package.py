"""Build a Dify plugin package (``.difypkg``) as ``dify plugin package`` does, and check it as Dify would.

The ``dify`` CLI is a Go binary (dify-plugin-daemon) that no PyPI or npm
package ships, so this replays what its packager does (langgenius/dify-plugin-daemon
at bdb5642a: ``pkg/plugin_packager``, ``pkg/entities``) and the daemon's manifest
checks at install:

* **files**: every file of the plugin folder except those ``.difyignore``
  (else ``.gitignore``) excludes, by go-git's gitignore patterns as the
  packager applies them: each pattern on its own (a ``!pattern`` never brings a
  file back), a pattern without ``/`` matches a name at any depth, an excluded
  folder is not entered; zip entries sorted by path;
* **size**: at most 50 MiB uncompressed (the CLI's ``--max-size`` default);
* **manifest**: the fields ``PluginDeclaration`` requires and their formats
  (version, names, tags, arch, runner, ``created_at``), one kind of extension
  (agent strategies exclude tools), every declared YAML present and parsed;
* **assets**: the plugin's and each tool provider's icon in ``_assets/``;
* **Marketplace**: ``README.md`` and the ``PRIVACY.md`` the manifest names.

``--wheel`` ships wheels inside the package (``wheels/``, with
``--find-links=./wheels/`` first in ``requirements.txt``), the route the plugin
README describes for a ``reach-plugins`` that is not on the daemon's index::

    python scripts/dify_package.py examples/dify_plugin/reach_tools --wheel dist/reach_plugins-0.1.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import yaml

from reach_plugins.errors import ConfigError

MAX_SIZE: Final = 50 * 1024 * 1024
"""``dify plugin package --max-size`` default (50 MB, uncompressed)."""
FIND_LINKS: Final = "--find-links=./wheels/"
VERSION: Final = re.compile(r"^\d{1,4}(\.\d{1,4}){2}(-\w{1,16})?$")
PLUGIN_NAME: Final = re.compile(r"^[a-z0-9_-]{1,128}$")
AUTHOR: Final = re.compile(r"^[a-z0-9_-]{1,64}$")
IDENTITY_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]+$")
TAGS: Final = frozenset(
    {
        *("search", "image", "videos", "weather", "finance", "design", "travel", "social", "news", "medical"),
        *("productivity", "education", "business", "entertainment", "utilities", "agent", "rag", "other", "trigger"),
    }
)
ARCH: Final = frozenset({"amd64", "arm64"})
CJK: Final = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
"""The template's review rule: "a README.md containing Chinese characters will be rejected"."""
TOOL_PARAMETER_TYPES: Final = frozenset(
    {
        *("string", "number", "boolean", "select", "secret-input", "file", "files", "app-selector"),
        *("model-selector", "any", "dynamic-select", "checkbox", "date", "date-range"),
    }
)
TOOL_PARAMETER_FORMS: Final = frozenset({"schema", "form", "llm"})
EXTENSIONS: Final = ("tools", "models", "endpoints", "agent_strategies", "datasources", "triggers")


# ----------------------------------------------------------------------------- ignore rules (go-git gitignore)


@dataclass(frozen=True, slots=True)
class Pattern:
    """One gitignore line as go-git's ``ParsePattern`` reads it."""

    parts: tuple[str, ...]
    negated: bool
    dir_only: bool
    anchored: bool
    """The pattern has a ``/`` inside: matched from the root, component by component."""

    @classmethod
    def parse(cls, line: str) -> Pattern:
        negated = line.startswith("!")
        text = line[1:] if negated else line
        if not text.endswith("\\ "):
            text = text.rstrip(" ")
        dir_only = text.endswith("/")
        text = text.removesuffix("/")
        return cls(tuple(text.split("/")), negated, dir_only, "/" in text)

    def excludes(self, path: tuple[str, ...], is_dir: bool) -> bool:
        """go-git's ``Match(...) == Exclude``: a negated pattern never excludes."""
        matched = self._glob(path, is_dir) if self.anchored else self._name(path, is_dir)
        return matched and not self.negated

    def _name(self, path: tuple[str, ...], is_dir: bool) -> bool:
        for index, name in enumerate(path):
            if fnmatch.fnmatchcase(name, self.parts[0]):
                return not (self.dir_only and not is_dir and index == len(path) - 1)
        return False

    def _glob(self, path: tuple[str, ...], is_dir: bool) -> bool:
        rest, matched, traverse = list(path), False, False
        for index, part in enumerate(self.parts):
            if part == "":
                traverse = False
                continue
            if part == "**":
                if index == len(self.parts) - 1:
                    break
                traverse = True
                continue
            if "**" in part or not rest:
                return False
            if traverse:
                traverse, matched = False, False
                while rest:
                    if fnmatch.fnmatchcase(rest.pop(0), part):
                        matched = True
                        break
            elif fnmatch.fnmatchcase(rest[0], part):
                matched = True
                rest.pop(0)
            else:
                return False
        if matched and self.dir_only and not is_dir and not rest:
            return False
        return matched


def ignore_patterns(root: Path) -> list[Pattern]:
    """The patterns of ``.difyignore``, else ``.gitignore`` (none when neither exists)."""
    for name in (".difyignore", ".gitignore"):
        source = root / name
        if source.is_file():
            lines = (line.strip() for line in source.read_text().splitlines())
            return [Pattern.parse(line) for line in lines if line and not line.startswith("#")]
    return []


def packaged_files(root: Path) -> list[str]:
    """The paths (``/``-separated, sorted) the packager puts in the zip."""
    patterns = ignore_patterns(root)
    found: list[str] = []

    def walk(folder: Path, prefix: tuple[str, ...]) -> None:
        for entry in sorted(folder.iterdir()):
            path = (*prefix, entry.name)
            if any(pattern.excludes(path, entry.is_dir()) for pattern in patterns):
                continue
            if entry.is_dir():
                walk(entry, path)
            else:
                found.append("/".join(path))

    walk(root, ())
    return sorted(found)


# ----------------------------------------------------------------------------- checks


def check(files: Mapping[str, bytes], *, max_size: int = MAX_SIZE) -> dict[str, Any]:
    """The manifest of a package's ``files`` (path -> content); ``ConfigError`` listing every problem found."""
    problems: list[str] = []
    manifest = _yaml(files, "manifest.yaml", problems)
    if not isinstance(manifest, dict):
        raise ConfigError("the package has no readable manifest.yaml: " + "; ".join(problems))
    _check_manifest(manifest, files, problems)
    _check_extensions(manifest.get("plugins") or {}, files, problems)
    total = sum(len(content) for content in files.values())
    if total > max_size:
        largest = sorted(files, key=lambda name: len(files[name]), reverse=True)[:5]
        problems.append(f"the package is {total} bytes uncompressed, over {max_size}: largest {largest}")
    if problems:
        raise ConfigError("the Dify plugin package would be refused:\n- " + "\n- ".join(problems))
    return manifest


def _check_manifest(manifest: Mapping[str, Any], files: Mapping[str, bytes], problems: list[str]) -> None:
    for key in ("version", "type", "name", "label", "description", "icon", "resource", "plugins", "meta", "created_at"):
        if not manifest.get(key):
            problems.append(f"manifest.yaml: {key!r} is required")
    _match(manifest.get("version"), VERSION, "manifest.yaml: version", problems)
    _match(manifest.get("name"), PLUGIN_NAME, "manifest.yaml: name", problems)
    _match(manifest.get("author"), AUTHOR, "manifest.yaml: author", problems)
    if manifest.get("type") != "plugin":
        problems.append(f"manifest.yaml: type must be 'plugin', got {manifest.get('type')!r}")
    for key in ("label", "description"):
        _i18n(manifest.get(key), f"manifest.yaml: {key}", problems)
    for tag in manifest.get("tags") or []:
        if tag not in TAGS:
            problems.append(f"manifest.yaml: tag {tag!r} is not one of {sorted(TAGS)}")
    if not (manifest.get("resource") or {}).get("memory"):
        problems.append("manifest.yaml: resource.memory (bytes) is required")
    _check_meta(manifest.get("meta") or {}, problems)
    try:
        datetime.fromisoformat(str(manifest.get("created_at")).replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"manifest.yaml: created_at {manifest.get('created_at')!r} is not an RFC 3339 time")
    for key in ("icon", "icon_dark"):
        if manifest.get(key) and f"_assets/{manifest[key]}" not in files:
            problems.append(f"manifest.yaml: {key} {manifest[key]!r} is not in _assets/")
    privacy = manifest.get("privacy")
    if not privacy:
        problems.append("manifest.yaml: 'privacy' must name the privacy policy (PRIVACY.md) for the Marketplace")
    elif privacy not in files or not files[privacy].strip():
        problems.append(f"manifest.yaml: privacy names {privacy!r}, which the package does not contain")
    readme = files.get("README.md", b"").decode("utf-8", "replace")
    if not readme.strip():
        problems.append("README.md is missing or empty (the Marketplace shows it)")
    elif CJK.search(readme):
        problems.append("README.md must be in English only (translations go in README_zh_Hans.md and the like)")


def _check_meta(meta: Mapping[str, Any], problems: list[str]) -> None:
    _match(meta.get("version"), VERSION, "manifest.yaml: meta.version", problems)
    arch = meta.get("arch") or []
    if not arch or not set(arch) <= ARCH:
        problems.append(f"manifest.yaml: meta.arch must list some of {sorted(ARCH)}, got {arch!r}")
    runner = meta.get("runner") or {}
    if runner.get("language") != "python":
        problems.append(f"manifest.yaml: meta.runner.language must be 'python', got {runner.get('language')!r}")
    for key in ("version", "entrypoint"):
        if not runner.get(key):
            problems.append(f"manifest.yaml: meta.runner.{key} is required")


def _check_extensions(plugins: Mapping[str, Any], files: Mapping[str, bytes], problems: list[str]) -> None:
    declared = [kind for kind in EXTENSIONS if plugins.get(kind)]
    if not declared:
        problems.append(f"manifest.yaml: plugins must declare one of {list(EXTENSIONS)}")
    if "agent_strategies" in declared and len(declared) > 1:
        problems.append(f"manifest.yaml: agent_strategies cannot be declared with {declared}")
    for provider_file in plugins.get("tools") or []:
        provider = _yaml(files, provider_file, problems)
        if isinstance(provider, dict):
            _check_identity(provider.get("identity"), provider_file, problems, icon=True)
            icon = (provider.get("identity") or {}).get("icon")
            if icon and f"_assets/{icon}" not in files:
                problems.append(f"{provider_file}: identity.icon {icon!r} is not in _assets/")
            for tool_file in provider.get("tools") or []:
                _check_tool(_yaml(files, tool_file, problems), tool_file, problems)
            _check_source(provider, provider_file, files, problems)
    for provider_file in plugins.get("agent_strategies") or []:
        provider = _yaml(files, provider_file, problems)
        if isinstance(provider, dict):
            _check_identity(provider.get("identity"), provider_file, problems, icon=True)
            for strategy_file in provider.get("strategies") or []:
                strategy = _yaml(files, strategy_file, problems)
                if isinstance(strategy, dict):
                    _check_identity(strategy.get("identity"), strategy_file, problems)
                    _check_source(strategy, strategy_file, files, problems)


def _check_tool(tool: Any, path: str, problems: list[str]) -> None:
    if not isinstance(tool, dict):
        return
    _check_identity(tool.get("identity"), path, problems)
    description = tool.get("description") or {}
    _i18n(description.get("human"), f"{path}: description.human", problems)
    if not description.get("llm"):
        problems.append(f"{path}: description.llm is required")
    for index, parameter in enumerate(tool.get("parameters") or []):
        where = f"{path}: parameters[{index}]"
        for key in ("name", "label", "human_description"):
            if not parameter.get(key):
                problems.append(f"{where}.{key} is required")
        if parameter.get("type") not in TOOL_PARAMETER_TYPES:
            problems.append(f"{where}.type {parameter.get('type')!r} is not one of {sorted(TOOL_PARAMETER_TYPES)}")
        if parameter.get("form") not in TOOL_PARAMETER_FORMS:
            problems.append(f"{where}.form {parameter.get('form')!r} is not one of {sorted(TOOL_PARAMETER_FORMS)}")


def _check_identity(identity: Any, path: str, problems: list[str], *, icon: bool = False) -> None:
    identity = identity if isinstance(identity, dict) else {}
    for key in ("author", "name", "label", *(("icon",) if icon else ())):
        if not identity.get(key):
            problems.append(f"{path}: identity.{key} is required")
    _match(identity.get("name"), IDENTITY_NAME, f"{path}: identity.name", problems)
    _i18n(identity.get("label"), f"{path}: identity.label", problems)


def _check_source(declaration: Mapping[str, Any], path: str, files: Mapping[str, bytes], problems: list[str]) -> None:
    source = ((declaration.get("extra") or {}).get("python") or {}).get("source")
    if source and source not in files:
        problems.append(f"{path}: extra.python.source {source!r} is not in the package")


def _yaml(files: Mapping[str, bytes], path: str, problems: list[str]) -> Any:
    if path not in files:
        problems.append(f"{path} is declared but not in the package")
        return None
    try:
        return yaml.safe_load(files[path])
    except yaml.YAMLError as exc:
        problems.append(f"{path} is not valid YAML: {exc}")
        return None


def _match(value: Any, pattern: re.Pattern[str], where: str, problems: list[str]) -> None:
    if value is not None and not pattern.match(str(value)):
        problems.append(f"{where} {value!r} must match {pattern.pattern}")


def _i18n(value: Any, where: str, problems: list[str]) -> None:
    if not isinstance(value, dict) or not str(value.get("en_US") or "").strip():
        problems.append(f"{where} needs an en_US text")


# ----------------------------------------------------------------------------- building


def pack(root: Path, *, max_size: int = MAX_SIZE) -> bytes:
    """The zip ``dify plugin package`` would write for ``root``, after the same checks."""
    names = packaged_files(root)
    files = {name: (root / name).read_bytes() for name in names}
    check(files, max_size=max_size)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            archive.writestr(name, files[name])
    return buffer.getvalue()


def read_package(path: Path) -> dict[str, bytes]:
    """Every file of a ``.difypkg``, by path."""
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}


def build(plugin: Path, out: Path, *, wheels: Iterable[Path] = ()) -> Path:
    """Package ``plugin`` into ``out`` (a folder) as ``{name}.difypkg``, with ``wheels`` under ``wheels/``."""
    with tempfile.TemporaryDirectory() as staging:
        root = Path(staging) / plugin.name
        shutil.copytree(plugin, root)
        _ship(root, list(wheels))
        package = pack(root)
    manifest = yaml.safe_load((plugin / "manifest.yaml").read_text())
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{manifest['name']}-{manifest['version']}.difypkg"
    target.write_bytes(package)
    return target


def _ship(root: Path, wheels: list[Path]) -> None:
    """Put ``wheels`` in ``root/wheels`` and make ``requirements.txt`` install from there first."""
    if not wheels:
        return
    folder = root / "wheels"
    folder.mkdir(exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, folder / wheel.name)
    requirements = root / "requirements.txt"
    lines = requirements.read_text().splitlines()
    if FIND_LINKS not in lines:
        requirements.write_text("\n".join([FIND_LINKS, *lines]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plugins", nargs="+", type=Path, help="plugin folders (each with a manifest.yaml)")
    parser.add_argument("--out", type=Path, default=Path("dist"), help="where the .difypkg files go (dist/)")
    parser.add_argument("--wheel", type=Path, action="append", default=[], help="a wheel to ship in wheels/")
    args = parser.parse_args(argv)
    try:
        for plugin in args.plugins:
            print(build(plugin, args.out, wheels=args.wheel))
    except ConfigError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
