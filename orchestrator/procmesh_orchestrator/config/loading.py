"""Loading the configuration: a YAML file, ``PROCMESH_CONFIG__*`` overrides, then validation."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.config.cost import SETTING_TAGS
from procmesh_orchestrator.config.lanes import _UNION_TAGS
from procmesh_orchestrator.config.schema import Config
from procmesh_orchestrator.errors import ConfigError


def parse_config(data: Any, source: str = "config") -> Config:
    """Validate a config mapping; errors name the key path and the problem."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines, tags = [], _UNION_TAGS | SETTING_TAGS
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"] if p not in tags) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError(f"invalid {source}:\n" + "\n".join(lines)) from None


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last one
    without a word, so two agents of one name would leave only the second (and the first one's
    guards would silently vanish)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first given on line {first.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse YAML as the config is read: safe types only, and no key given twice in a mapping."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe types only


ENV_PREFIX = "PROCMESH_CONFIG__"
"""``PROCMESH_CONFIG__SIDECARS__GUARDS__ADDRESS=unix:///run/g.sock`` sets ``sidecars.guards.address``."""


def _same_key(a: str, b: str) -> bool:
    return a.replace("_", "").lower() == b.replace("_", "").lower()


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> list[str]:
    """Override config keys from ``PROCMESH_CONFIG__<KEY>__<KEY>...`` variables; returns the paths set.

    Segments match existing keys ignoring case and underscores (``MAX_STEPS`` is ``maxSteps``); a
    new key takes the camelCase spelling. Values are read as YAML scalars or flow collections
    (``3``, ``true``, ``[a, b]``).
    """
    applied = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        segments = [s for s in name[len(ENV_PREFIX) :].split("__") if s]
        if not segments:
            continue
        node = data
        path: list[str] = []
        for i, segment in enumerate(segments):
            # an existing key, else the config's camelCase spelling (MAX_STEPS -> maxSteps)
            matching = [k for k in node if isinstance(k, str) and _same_key(k, segment)]
            if len(matching) > 1:  # the first would be set, without a word about the other
                where = ".".join(path) or "the top level"
                raise ConfigError(
                    f"{name}: {segment} names {len(matching)} keys of {where} "
                    f"({', '.join(map(repr, matching))}: case and underscores aside they are one name); "
                    "rename one of them"
                )
            key = matching[0] if matching else to_camel(segment.lower())
            path.append(key)
            if i == len(segments) - 1:
                try:
                    node[key] = load_yaml(environ[name])
                except yaml.YAMLError as exc:
                    raise ConfigError(f"{name}: not a YAML value: {exc}") from None
            else:
                child = node.get(key)
                if child is None:
                    child = node[key] = {}
                if not isinstance(child, dict):
                    raise ConfigError(f"{name}: {'.'.join(path)} is not a mapping")
                node = child
        applied.append(".".join(path))
    return applied


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read a YAML config file, apply ``PROCMESH_CONFIG__*`` overrides, validate."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return config_from_text(text, str(path), environ)


def config_from_text(text: str, path: str, environ: Mapping[str, str] | None = None) -> Config:
    """A config file's text (read from `path`) with the ``PROCMESH_CONFIG__*`` overrides, validated:
    what `load_config` does after reading (a reload reads the file once, for its hash too)."""
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    apply_env_overrides(data, os.environ if environ is None else environ)
    return parse_config(data, str(path))
