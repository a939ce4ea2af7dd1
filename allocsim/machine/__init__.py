"""The machine a policy runs on (docs/architecture.md, "Layers"): the simulated device and its driver placement,
the real one (`gpu`), the runtime that frees (eager or a garbage collector), the cost model and its
calibration, the memory a replay runs on (`capacity`, `ranks`), the sections a policy times and the result
record (`metrics`). Below the policies: nothing here knows one."""
