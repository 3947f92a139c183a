"""The per-kernel profiler: the time, FLOPs and bytes of every step of a compiled model.

    profile = module.profile({"x": x}, repeat=20, peak=measure_peak(threads=2))
    console.print(profile.table(top=10))     # slowest steps first, with a total line
    profile.to_json()

    ember profile MODEL.onnx --batch 8 --peak --json out.json    # the command line

- :mod:`ember.profile.profile` -- joins the runtime's per-step times with the build's steps
- :mod:`ember.profile.table` -- the rich table
- :mod:`ember.profile.peak` -- this machine's FMA peak and memory bandwidth, measured now

The timing itself is the runtime's (``CompiledModel.profile``, over the library's
``ember_run_profiled``): it needs nothing but the artifact.
"""

from ember.profile.peak import Peak, measure_fma_peak, measure_peak
from ember.profile.profile import Profile, StepProfile, build_profile

__all__ = ["Peak", "Profile", "StepProfile", "build_profile", "measure_fma_peak",
           "measure_peak"]
