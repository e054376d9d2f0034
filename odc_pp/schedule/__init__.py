"""Schedule engine: IR, generators, lowering passes, simulator, search, rendering."""

from .costs import CostModel
from .ir import Action, ActionKind, Placement, Schedule

__all__ = ["Action", "ActionKind", "CostModel", "Placement", "Schedule"]
