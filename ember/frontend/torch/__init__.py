"""The PyTorch frontend: ATen graphs from ``torch.export`` or ``torch.compile`` -> ember.

Importing this package imports torch; ember itself does not need torch unless this is used.
"""

from ember.frontend.torch.export import import_exported_program, import_module
from ember.frontend.torch.importer import ImportedGraph, import_fx, node_problem

__all__ = ["ImportedGraph", "import_exported_program", "import_fx", "import_module",
           "node_problem"]
