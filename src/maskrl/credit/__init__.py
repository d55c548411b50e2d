"""Credit-assignment modules (SPEC §2–§4), registered by name in :data:`CREDITS`.

Protocol and seam: :mod:`maskrl.credit.base`. A new method is one file with a registered frozen
dataclass; the trainer knows no module by name. A user's own module lives in the user's package and
is loaded with ``plugins: [my_package.my_credit]`` in the YAML (or ``--plugin``).
"""
from maskrl.credit.base import CreditBatch, CreditContext, CreditModule, apply_credit, check_credit_batch
from maskrl.registry import Registry

CREDITS: Registry = Registry("credit module")

from maskrl.credit.dps import DPS  # noqa: E402  (registered below; imports only credit.base)

CREDITS.register("dps")(DPS)

from maskrl.credit.dispo import DiSPO  # noqa: E402

CREDITS.register("dispo")(DiSPO)

from maskrl.credit.rldf import RLDFSteps  # noqa: E402

CREDITS.register("rldf_steps")(RLDFSteps)

from maskrl.credit.dtca import DTCA  # noqa: E402

CREDITS.register("dtca")(DTCA)

__all__ = ["CREDITS", "DPS", "DTCA", "DiSPO", "RLDFSteps", "CreditBatch", "CreditContext", "CreditModule",
           "apply_credit", "check_credit_batch"]
