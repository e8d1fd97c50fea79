"""The functional executor: a KernelProgram's numbers, bit-exact in the device formats.

executor.py (runs the steps), access.py (how an argument maps a buffer onto a kernel's space), reduce.py (matmul and
reductions in the order the split implies), sfp_math.py (the SFP vector unit's functions).
"""
