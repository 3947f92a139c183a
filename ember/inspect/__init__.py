"""``ember inspect --stages``: every stage of a compilation, in the terminal or as HTML.

- :mod:`ember.inspect.stages` compiles with every pass dumped and collects the rows: the
  graph after each pass, the kernels, the memory plan, each kernel's C;
- :mod:`ember.inspect.terminal` prints them as tables, :mod:`ember.inspect.html` writes one
  self-contained page, with the compiled graph drawn by :mod:`ember.inspect.svg` on the
  layered layout of :mod:`ember.inspect.layout`;
- :mod:`ember.inspect.c_source` cuts one function out of the generated C.

The package sits above the compile driver (it compiles) and below the command line.
"""

from ember.inspect.c_source import FunctionNotFound, extract_c_function
from ember.inspect.html import render_html, write_html
from ember.inspect.stages import KernelStage, MemoryStage, PassStage, Stages, collect_stages

__all__ = ["FunctionNotFound", "KernelStage", "MemoryStage", "PassStage", "Stages",
           "collect_stages", "extract_c_function", "render_html", "write_html"]
