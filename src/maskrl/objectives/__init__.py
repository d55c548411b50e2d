"""Base objectives (SPEC §1.5), registered by name: hyper-parameters as dataclass fields, tensors in
``__call__`` (protocol and metric rule: :mod:`maskrl.objectives.base`)."""
from maskrl.objectives.base import KL_LOG_RATIO_BOUND, Objective, aggregate, clip_binds, kl3, kl3_clamped
from maskrl.objectives.diffu_grpo import DiffuGRPO
from maskrl.objectives.gdpo import GDPO
from maskrl.objectives.rldf import RLDF
from maskrl.objectives.spg import SPG
from maskrl.objectives.wd1 import WD1
from maskrl.registry import Registry

OBJECTIVES: Registry = Registry("objective")
OBJECTIVES.register("diffu_grpo")(DiffuGRPO)
OBJECTIVES.register("wd1")(WD1)
OBJECTIVES.register("gdpo")(GDPO)
OBJECTIVES.register("rldf")(RLDF)
OBJECTIVES.register("spg")(SPG)

__all__ = ["OBJECTIVES", "DiffuGRPO", "GDPO", "RLDF", "SPG", "WD1", "Objective", "aggregate", "kl3", "kl3_clamped",
           "clip_binds", "KL_LOG_RATIO_BOUND"]
