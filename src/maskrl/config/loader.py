"""Reading a run configuration: YAML files merged in order, overrides applied, plug-ins imported,
the dataclasses built and checked."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import yaml

from maskrl.config.build import _build, _coerce, _mark, _resolve_path
from maskrl.config.checks import _check_ranges
from maskrl.config.overrides import apply_override
from maskrl.config.schema import ConfigError, RunConfig
from maskrl.files import not_utf8
from maskrl.yamlfile import DuplicateKeyError, load_yaml


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(paths: Sequence[str | Path] = (), overrides: Sequence[str] = (),
                plugins: Sequence[str] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from YAML files (later ones win) and ``key=value`` overrides.

    The ``plugins`` list of the result (modules imported before the config is built, see
    :func:`load_plugins`) is the YAML's followed by ``plugins`` (the command line's ``--plugin``).

    Relative input paths in a YAML file are read from that file's folder, those of overrides from the
    working directory (see :class:`RunConfig`).

    Raises:
        ConfigError: on an unknown key (naming it and the valid ones), a mistyped value, or a key
            repeated in one mapping of a YAML file (naming the key and both lines).
        FileNotFoundError: when a YAML file does not exist.
        ConfigError: a path that is a folder, a file that is not UTF-8 or not valid YAML (one line).
    """
    data: dict = {}
    for p in paths:
        if Path(p).is_dir():
            raise ConfigError(f"config file {p} is a folder, not a YAML file")
        if not Path(p).is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            with open(p, encoding="utf-8") as fh:
                loaded = load_yaml(fh) or {}
        except DuplicateKeyError as e:
            raise ConfigError(f"{p}: {e}") from None
        except yaml.YAMLError as e:  # its text runs over several lines (problem, context, mark)
            raise ConfigError(f"{p}: not valid YAML ({' '.join(str(e).split())})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(not_utf8(p, e)) from None
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"{p}: top level must be a mapping")
        data = _merge(data, _mark(loaded, Path(p).parent))
    for item in overrides:
        data = apply_override(data, item)
    data["plugins"] = [str(v) for v in _resolve_path(_coerce(data.get("plugins", []), list, "plugins"), "module")]
    data["plugins"] += list(plugins)
    load_plugins(data["plugins"])
    cfg = _build(RunConfig, data)
    _check_ranges(cfg)
    return cfg


def load_plugins(specs: Sequence[str]) -> list:
    """Import user modules so that their registrations (objectives, likelihoods, credit modules,
    tasks) exist before the config is built. A spec is a dotted module name (importable from
    ``sys.path``) or a path to a ``.py`` file. Importing is idempotent.

    Returns:
        The imported modules.

    Raises:
        ConfigError: naming the plugin (``plugins[i]``) when it cannot be imported.
    """
    import hashlib
    import importlib
    import importlib.util
    import sys

    modules = []
    for i, spec in enumerate(specs):
        try:
            if spec.endswith(".py") or "/" in spec or "\\" in spec:
                path = Path(spec).expanduser().resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no such file {path}")
                if path.suffix != ".py":  # importlib finds no loader for it
                    raise ImportError(f"{path} is not a Python file (.py)")
                name = "maskrl_plugin_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:8]
                if name not in sys.modules:
                    mod_spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(mod_spec)
                    sys.modules[name] = module
                    try:
                        mod_spec.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
                modules.append(sys.modules[name])
            else:
                modules.append(importlib.import_module(spec))
        except Exception as e:  # noqa: BLE001 - any import failure is the plugin's, named here
            raise ConfigError(f"plugins[{i}]: cannot import {spec!r} ({type(e).__name__}: {e})") from None
    return modules
