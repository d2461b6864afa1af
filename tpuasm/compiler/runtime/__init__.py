"""Running a compiled model: its steps (steps.py: TPU segments on the machine, host parts on
onnxruntime), the CompiledModel API (model.py), data-parallel runs on Dask (distributed.py)
and the check against the float model (validate.py)."""
