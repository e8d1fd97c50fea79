"""The KernelProgram IR: the one contract between the stack and the chip.

program.py (buffers, kernels, host steps), validate.py (checks on construction), layout.py (stick math),
listing.py (the printed form), serialize.py (JSON).
"""
