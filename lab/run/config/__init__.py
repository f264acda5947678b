"""Configuration: YAML files and `--set` overrides into frozen, validated dataclasses.

Precedence, lowest first: the defaults declared in lab.run.config.schema, then the YAML file, then
each `--set section.key=value` in order. Every field is documented where it is
declared; `lab train --help-config` prints them.

>>> cfg = load(None, ["train.global_batch_size=64", "model.width=16"])
>>> cfg.train.global_batch_size, cfg.model.width, cfg.model.norm
(64, 16, 'batch')
>>> load(None, ["train.global_batch_size=-4"])
Traceback (most recent call last):
...
lab.errors.ConfigError: --set train.global_batch_size: -4 is out of range; expected an integer >= 1

Rules between fields live in lab.run.config.rules: those that need the world size (the global batch must split
evenly over ranks and accumulation steps) are checked by `check_layout` once it is known. dist.strategy takes
the names of the strategy table, lab.run.config.strategies.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from lab.errors import ConfigError
from lab.run.config import rules, strategies
from lab.run.config.rules import batch_size_per_rank, check_layout
from lab.run.config.schema import (
    SECTIONS,
    SYNC_BATCHNORM_WAITS,
    CheckpointConfig,
    Config,
    DataConfig,
    DistConfig,
    MetricsConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    knob,
)

if TYPE_CHECKING:  # types only: loading a config (the CLI, --help-config) imports no torch
    import torch

__all__ = [
    "SYNC_BATCHNORM_WAITS",
    "knob",
    "RunConfig",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "DistConfig",
    "CheckpointConfig",
    "MetricsConfig",
    "SECTIONS",
    "Config",
    "batch_size_per_rank",
    "check_layout",
    "describe",
    "from_dict",
    "host_sync_warning",
    "load",
    "to_dict",
    "with_overrides",
]

_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

SHIPPED_DIR = Path(__file__).parent / "presets"


# ----------------------------------------------------------------------------- loading


def resolve_path(name_or_path: str) -> Path:
    """A config path as given, or the name of a shipped config (`smoke`, `ddp`, ...)."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return path
    shipped = SHIPPED_DIR / f"{name_or_path}.yaml"
    return shipped if shipped.exists() else path


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def load(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `overrides` ("a.b=v")."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    origin = "<defaults>"
    if path is not None:
        resolved = resolve_path(str(path))
        origin = str(resolved)
        for section, key, value in _read_yaml(resolved):
            values[section][key] = _check(origin, section, key, value)
    for item in overrides:
        section, key, value = _parse_override(item)
        values[section][key] = _check(f"--set {section}.{key}", section, key, value)
    sections = {name: cls(**values[name]) for name, cls in SECTIONS.items()}
    cfg = Config(**sections, origin=origin)
    rules.check(cfg, strategies.STRATEGIES)
    return cfg


def _read_yaml(path: Path) -> Iterator[tuple[str, str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: config file not found; give a path or one of: {', '.join(shipped_names())}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML ({problem})") from None
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections ({', '.join(SECTIONS)}), got {_kind(doc)}")
    for section, body in doc.items():
        _known(f"{path}: {section}", str(section), list(SECTIONS), "sections")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {section}: must be a mapping of keys, got {_kind(body)}")
        for key, value in body.items():
            yield section, str(key), value


def _parse_override(item: str) -> tuple[str, str, Any]:
    name, sep, raw = item.partition("=")
    name = name.strip()
    if not sep or "." not in name:
        raise ConfigError(f"--set {item}: expected section.key=value, for example --set train.lr=0.1")
    section, _, key = name.partition(".")
    _known(f"--set {name}", section, list(SECTIONS), "sections")
    _field(f"--set {name}", section, key)
    hint = _hint(section, key)
    # Text fields take the raw text, so `--set run.id=0042` stays a string.
    if hint is str or typing.get_origin(hint) is Literal:
        return section, key, raw
    try:
        return section, key, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return section, key, raw


def _field(where: str, section: str, key: str) -> dataclasses.Field[Any]:
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    _known(where, key, list(fields), f"keys in {section}")
    return fields[key]


def _known(where: str, name: str, valid: list[str], what: str) -> None:
    """Raise unless `name` is one of `valid`; suggest the closest valid name."""
    if name in valid:
        return
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(f"{where}: unknown key; {hint}valid {what}: {', '.join(valid)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # Field types are strings under `from __future__ import annotations`; this module's names resolve them.
    return typing.get_type_hints(cls)


def _hint(section: str, key: str) -> Any:
    return _hints(SECTIONS[section])[key]


def _check(origin: str, section: str, key: str, value: Any) -> Any:
    """Return `value` converted to the field's type, or raise a ConfigError saying what is valid."""
    where = origin if origin.startswith("--set") else f"{origin}: {section}.{key}"
    fld = _field(where, section, key)
    hint = _hint(section, key)
    lo, hi = fld.metadata.get("min"), fld.metadata.get("max")
    table = fld.metadata.get("choices")
    if typing.get_origin(hint) is Literal or table:
        return _one_of(where, value, list(table()) if table else typing.get_args(hint))
    if hint is bool:
        return _boolean(where, value)
    if hint is int:
        value = _integer(where, value, lo, hi)
    elif hint is float:
        value = _number(where, value, lo, hi)
    elif hint is str:
        return _text(where, value)
    # An int, a float, or a type with no check of its own (float | None): its bounds, where the field has any.
    _within(where, value, hint, lo, hi)
    return value


def _one_of(where: str, value: Any, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise ConfigError(f"{where}: {value!r} is not allowed; expected one of {', '.join(map(str, choices))}")
    return value


def _boolean(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {_show(value)}")
    return value


def _integer(where: str, value: Any, lo: float | None, hi: float | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):  # True is an int to Python, not to a config
        raise ConfigError(f"{where}: expected an integer{_range(lo, hi)}, got {_show(value)}")
    return value


def _number(where: str, value: Any, lo: float | None, hi: float | None) -> float:
    if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 (PyYAML) reads 5e-4 as text: it wants 5.0e-4
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number{_range(lo, hi)}, got {_show(value)}")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"{where}: expected a finite number{_range(lo, hi)}, got {number}")
    return number


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {_show(value)}")
    return value


def _within(where: str, value: Any, hint: Any, lo: float | None, hi: float | None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        noun = "an integer" if hint is int else "a number"
        raise ConfigError(f"{where}: {value} is out of range; expected {noun}{_range(lo, hi)}")


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo:g}, {hi:g}]"
    if lo is not None:
        return f" >= {lo:g}"
    return f" <= {hi:g}" if hi is not None else ""


def _show(value: Any) -> str:
    return f"{_kind(value)} {value!r}" if not isinstance(value, (dict, list)) else _kind(value)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


# ----------------------------------------------------------------------------- warnings


def host_sync_warning(cfg: Config, device: torch.device | str) -> str | None:
    """The start-of-run line for a run whose step loop waits for the device (SyncBatchNorm on CUDA), or None.

    >>> import types
    >>> cfg = with_overrides(load(None), model={"sync_batchnorm": True})
    >>> host_sync_warning(cfg, types.SimpleNamespace(type="cpu")) is None
    True
    """
    if not (cfg.model.sync_batchnorm and getattr(device, "type", device) == "cuda"):
        return None
    return f"model.sync_batchnorm=true on CUDA: {SYNC_BATCHNORM_WAITS}"


# ----------------------------------------------------------------------------- output


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}


def from_dict(values: dict[str, dict[str, Any]], origin: str) -> Config:
    """A config that `load` already checked, back from `to_dict`'s form (a run's resolved file, which its parent
    wrote after every check): nothing is checked again.

    >>> cfg = load("smoke")
    >>> from_dict(to_dict(cfg), cfg.origin) == cfg
    True
    """
    return Config(**{name: cls(**values[name]) for name, cls in SECTIONS.items()}, origin=origin)


def describe() -> str:
    """Every key with its default and documentation, for `--help-config`."""
    lines = []
    for name, cls in SECTIONS.items():
        lines.append(f"{name}:")
        for f in dataclasses.fields(cls):
            value = yaml.safe_dump(f.default, default_flow_style=True).strip().removesuffix("...").strip()
            table = f.metadata["choices"]
            allowed = f" One of: {'; '.join(f'{n} ({says})' for n, says in table().items())}." if table else ""
            lines.append(f"  {f.name}: {value}  # {f.metadata['help']}{allowed}")
    return "\n".join(lines)


def with_overrides(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of `cfg` with some keys replaced, e.g. with_overrides(cfg, run={"id": "x"})."""
    replaced = {name: dataclasses.replace(getattr(cfg, name), **values) for name, values in sections.items()}
    return dataclasses.replace(cfg, **replaced)
