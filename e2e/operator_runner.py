"""The e2e suite's handle on a running operator: `meshplan.controller.process.OperatorProcess`.

Kept as a module of e2e/ so tests (and other suites, e.g. reliability) import
one name; the implementation lives in the package because `meshplan demo`
starts the operator the same way.
"""

from meshplan.controller.process import OperatorProcess

__all__ = ["OperatorProcess"]
