"""The compile pipeline: Graph → passes → kernels → one C library + weights + manifest."""

from ember.driver.pipeline import Build, BuildOptions, CompileError, build_graph

__all__ = ["Build", "BuildOptions", "CompileError", "build_graph"]
