"""Base objectives (SPEC §1.5): hyper-parameters in the constructor, tensors in ``__call__``."""
from maskrl.objectives.base import aggregate, kl3
from maskrl.objectives.diffu_grpo import DiffuGRPO
from maskrl.registry import Registry

OBJECTIVES: Registry = Registry("objective")
OBJECTIVES.register("diffu_grpo")(DiffuGRPO)

__all__ = ["OBJECTIVES", "DiffuGRPO", "aggregate", "kl3"]
