"""What each framework's allocator is told, one module per framework: the settings' syntax.

`torch` (``PYTORCH_ALLOC_CONF``: the options, the ``roundup_power2_divisions`` table both
ways, the settings a trace recorded, the snapshot's ``allocator_settings``), `cupy`
(``CUPY_GPU_MEMORY_LIMIT``), `julia` (the CuArrays pools' ``CUARRAYS_MEMORY_*``). The
models, `allocsim tune` and the snapshot export read and write settings only through
these; what the allocators *do* with them stays in `allocsim.policies`. Nothing here
imports a policy, so a model and its reference can both take their options from here.
"""
