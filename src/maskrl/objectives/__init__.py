"""Base objectives (docs/spec.md §1.5), registered by name in :data:`OBJECTIVES`: hyper-parameters as dataclass
fields, tensors in ``__call__`` (protocol and metric rule: :mod:`maskrl.objectives.base`). Each built-in
registers itself in its own file; importing this package imports them."""
from maskrl.objectives.base import KL_LOG_RATIO_BOUND, OBJECTIVES, RATIO_LOG_BOUND, Objective, aggregate, clip_binds, \
    importance_ratio, kl3, kl3_clamped, ratio_clamped
from maskrl.objectives.diffu_grpo import DiffuGRPO
from maskrl.objectives.ebpo import EBPO
from maskrl.objectives.gdpo import GDPO
from maskrl.objectives.rldf import RLDF
from maskrl.objectives.spg import SPG
from maskrl.objectives.tracerl import TraceRL
from maskrl.objectives.wd1 import WD1

__all__ = ["OBJECTIVES", "DiffuGRPO", "EBPO", "GDPO", "RLDF", "SPG", "TraceRL", "WD1", "Objective", "aggregate", "kl3", "kl3_clamped",
           "clip_binds", "KL_LOG_RATIO_BOUND", "RATIO_LOG_BOUND", "importance_ratio", "ratio_clamped"]
