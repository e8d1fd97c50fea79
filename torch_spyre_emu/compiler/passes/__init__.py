"""Compiler passes, one small file each, run in this order by torch_spyre_emu.compiler.pipeline:

graph level (fx.GraphModule -> fx.GraphModule):  decompose -> mm_to_bmm -> constant_fold -> scalars_to_tensors
                                                 -> legalize_dtypes -> support_check
kernel level (ProgramParts -> ProgramParts):     stickify -> restickify -> pad_k -> work_division
                                                 -> split_weight_prep -> sink_to_consumers -> lx_planning
                                                 -> bundle_kernels

Every pass also reads the frozen CompileOptions (compiler/context.py).
"""
