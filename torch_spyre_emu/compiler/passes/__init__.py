"""Compiler passes, one small file each, run in this order by torch_spyre_emu.compiler.pipeline:

graph level (FX, core aten):  decompose -> mm_to_bmm -> constant_fold -> scalars_to_tensors -> legalize_dtypes
                              -> support_check
kernel level (KernelProgram): stickify -> restickify -> pad_k -> work_division -> lx_planning
"""
