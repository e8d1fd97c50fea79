"""Speed of eager Spyre ops (the real stack's flow outside compiled code) against the CPU, measured in the same run.

Every eager op on spyre tensors is traced once per signature, then each call runs its cached program through the
simulated chip (numbers and timing, config.mode "both") and allocates its result on the emulated device: a fixed
cost per op that dominates small tensors. Two measurements:

1. one op (`x * 2`, `x @ w`, `softmax`) on a 64x128 fp16 tensor: median time per call on spyre and on the CPU;
2. the device-resident forward of a small transformers decoder (LlamaConfig hidden 256, 2 layers, fp16, the adapters
   applied, `Module.to("spyre")`, inputs on the card: how the zoo's device_resident run and torch-spyre users run
   a model eagerly), against the same model's CPU fp32 eager forward.

No target: these show where eager time goes and whether a change moved it. Medians of alternating blocks.
Run: .venv/bin/python benchmarks/bench_eager.py [--repeats N]. The last line is the forward's ratio.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
from bench_stack import decoder  # the same small LlamaConfig model (benchmarks/ is this script's sys.path[0])


def per_call(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def alternating(a, b, repeats: int, calls: int) -> tuple[float, float]:
    """Medians of `repeats` alternating blocks of `calls` calls each, after one warm-up call of each."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(per_call(a, calls))
        tb.append(per_call(b, calls))
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="alternating blocks per measurement (median)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    warnings.simplefilter("ignore")  # FallbackWarnings of the model's CPU islands: expected, not measured here
    torch.manual_seed(0)
    x_cpu = torch.randn(64, 128, dtype=torch.float16)
    w_cpu = torch.randn(128, 128, dtype=torch.float16)
    x, w = x_cpu.to("spyre"), w_cpu.to("spyre")
    ops = {"x * 2": lambda a, b: a * 2, "x @ w": lambda a, b: a @ b, "softmax": lambda a, b: a.softmax(-1)}
    for name, op in ops.items():
        dev, cpu = alternating(lambda op=op: op(x, w), lambda op=op: op(x_cpu, w_cpu), args.repeats, 50)
        print(f"eager {name:8s} 64x128 fp16: spyre {dev * 1e6:7.0f} us/call, CPU {cpu * 1e6:5.1f} us/call")

    import adapters

    model = decoder(2)
    device_model = copy.deepcopy(model).half()
    adapters.apply(device_model)
    device_model.to("spyre")
    ids = torch.randint(0, 1024, (1, 64))
    ids_dev = ids.to("spyre")
    with torch.no_grad():
        dev, cpu = alternating(lambda: device_model(ids_dev), lambda: model(ids), args.repeats, 2)
    print(f"decoder 2x256, 64 tokens, eager: device-resident fp16 median {dev * 1e3:.0f} ms, "
          f"CPU fp32 {cpu * 1e3:.1f} ms")  # fmt: skip
    print(f"eager forward ratio emulated / CPU fp32: {dev / cpu:.1f}")


if __name__ == "__main__":
    main()
