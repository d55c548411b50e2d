"""Run configuration: nested dataclasses filled from YAML files and ``--set key=value`` overrides.

Every field is typed; an unknown key or a value of the wrong type is an error that names the key
(dotted path) and lists the valid keys, so a typo never silently falls back to a default.

The package follows the steps a config goes through: :mod:`~maskrl.config.schema` (the sections'
dataclasses and their defaults), :mod:`~maskrl.config.build` (YAML -> typed sections and registered
components), :mod:`~maskrl.config.overrides` (``--set``), :mod:`~maskrl.config.checks` (cross-field
checks), :mod:`~maskrl.config.loader` (:func:`load_config`, plug-ins) and
:mod:`~maskrl.config.explain` (``maskrl config --explain``).
"""
from maskrl.config.schema import (LR_SCHEDULERS, MOVED, REMOVED, TINY_TOKENIZERS, TRAIN_REWARDS, ConfigError,
                                  FileTaskConfig, ModelConfig, RunConfig, SFTConfig, TaskConfig, TinyModelConfig,
                                  TrainConfig, component_registry, field_types, own_likelihood)
from maskrl.config.build import to_dict
from maskrl.config.overrides import apply_override, parse_override
from maskrl.config.checks import tracker_names
from maskrl.config.loader import load_config, load_plugins
from maskrl.config.explain import _SECTIONS, explain, field_docs

__all__ = ["LR_SCHEDULERS", "MOVED", "REMOVED", "TINY_TOKENIZERS", "TRAIN_REWARDS", "ConfigError", "FileTaskConfig",
           "ModelConfig", "RunConfig", "SFTConfig", "TaskConfig", "TinyModelConfig", "TrainConfig", "apply_override",
           "component_registry", "explain", "field_docs", "field_types", "load_config", "load_plugins",
           "own_likelihood", "parse_override", "to_dict", "tracker_names"]
