"""Credit-assignment modules (docs/spec.md §2–§4), registered by name in :data:`CREDITS`.

Protocol and seam: :mod:`maskrl.credit.base` (where :data:`CREDITS` lives). A new method is one file
with a registered frozen dataclass; the trainer knows no module by name. A user's own module lives in
the user's package and is loaded with ``plugins: [my_package.my_credit]`` in the YAML (or ``--plugin``).
The built-ins register themselves in their own files; importing this package imports them.
"""
from maskrl.credit.base import CREDITS, CreditBatch, CreditContext, CreditModule, apply_credit, check_credit_batch
from maskrl.credit.dps import DPS
from maskrl.credit.dispo import DiSPO
from maskrl.credit.rldf import RLDFSteps
from maskrl.credit.dtca import DTCA

__all__ = ["CREDITS", "DPS", "DTCA", "DiSPO", "RLDFSteps", "CreditBatch", "CreditContext", "CreditModule",
           "apply_credit", "check_credit_batch"]
