"""Program builders without torch: the generic ProgramBuilder (program_builder.py), one-kernel programs
(basic.py: a matmul, an elementwise op) and a Llama decoder forward as a workload (llama.py).

p = matmul_program(256, 1024, 512, split={"n": 8, "k": 4})      # 32 cores, K split 4 ways
out = aiu_sim.run(p, {"a": a, "b": b}, mode="functional").outputs["c"]
"""

from aiu_sim.builders.basic import elementwise_program, matmul_program
from aiu_sim.builders.llama import llama_decoder_program, llama_example_inputs
from aiu_sim.builders.program_builder import HOST_DTYPE, ProgramBuilder, SplitPolicy, equal_split

__all__ = [
    "HOST_DTYPE",
    "ProgramBuilder",
    "SplitPolicy",
    "elementwise_program",
    "equal_split",
    "llama_decoder_program",
    "llama_example_inputs",
    "matmul_program",
]
