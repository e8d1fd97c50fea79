"""The device half of the emulated stack: the "spyre" device and its tensors, below the compiler.

register.py (PrivateUse1 renamed, kernels and Tensor API installed), tensor.py / storage.py (spyre tensors and their
device values), layout.py (SpyreTensorLayout), host_dtypes.py (torch dtypes <-> device formats), memory.py,
streams.py, spyre_module.py (the torch.spyre module), tensor_api.py (torch.Tensor additions), kernels.py (allocation
and copies), op_dispatch.py (aten ops on spyre tensors -> eager.run_op).
"""
