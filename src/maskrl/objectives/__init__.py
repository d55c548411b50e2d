"""Base objectives (SPEC §1.5), registered by name: hyper-parameters as dataclass fields, tensors in
``__call__`` (protocol and metric rule: :mod:`maskrl.objectives.base`)."""
from maskrl.objectives.base import Objective, aggregate, kl3
from maskrl.objectives.diffu_grpo import DiffuGRPO
from maskrl.registry import Registry

OBJECTIVES: Registry = Registry("objective")
OBJECTIVES.register("diffu_grpo")(DiffuGRPO)

__all__ = ["OBJECTIVES", "DiffuGRPO", "Objective", "aggregate", "kl3"]
