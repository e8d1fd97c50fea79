"""One rank of the tensor-parallel tests, launched by torchrun (tests/models/test_tensor_parallel_torchrun.py):

    python -m torch.distributed.run --standalone --nproc-per-node N tests/models/tp_worker.py OUT.json \\
        --model tiny|smollm2 --tp 1,2,4,2:host --new-tokens 20 [--device spyre|cpu] [--families llama,...]

All runs share one launch, so processes start once: degree d uses the process group of ranks 0..d-1
(torch.distributed.new_group), the other ranks wait. For each run, on emulated Spyre (fp16 weights, DL16, the
adapters, the static decode loop; the weights on each rank's card): greedy tokens, and for d > 1 teacher forcing on
the TP=1 tokens. "2:host" runs TP=2 with the all-reduces between the compiled graphs (eager spyreccl). --families
also shards each zoo family's tiny model in CPU fp32 and compares its logits with the unsharded model's. Rank 0
writes OUT.json; any rank's exception is written there too (and the launch fails).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def _group(d: int, groups: dict):
    return None if d == dist.get_world_size() else groups[d]


# SmolLM2-135M's awkward head counts (9 q heads over 3 KV heads) at a tiny width: uneven splits at TP=2 and 4.
FAMILY_DIMS = dict(
    vocab_size=512,
    hidden_size=144,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.1,
)


def cpu_families(families: list[str], degrees: list[int], groups: dict) -> dict:
    """fp32 logits of a tiny model of each family, sharded over d ranks, against the unsharded model's."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    from models.tensor_parallel import tensor_parallel

    out: dict = {}
    rank = dist.get_rank()
    for fam in families:
        torch.manual_seed(0)
        ref = AutoModelForCausalLM.from_config(AutoConfig.for_model(fam, **FAMILY_DIMS)).eval()
        ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = ref(ids).logits
        for d in degrees:
            if d == 1:
                continue
            if rank < d:
                model = copy.deepcopy(ref)
                handle = tensor_parallel(model, group=_group(d, groups), world_size=d)
                with torch.no_grad():
                    got = model(ids).logits
                scale = want.abs().max().item()
                out[f"{fam}/{d}"] = {
                    "max_abs_diff": (got - want).abs().max().item(),
                    "scale": scale,
                    "argmax_equal": bool((got.argmax(-1) == want.argmax(-1)).all()),
                    "summary": handle.summary(),
                    "all_reduces": handle.all_reduces_per_forward,
                }
            dist.barrier()
    return out


def _load(model: str, prompt_seed: int):
    if model == "tiny":
        from models import tiny

        ref = tiny.tiny_llama()
        ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(prompt_seed))
        return ref, ids
    from models import demo, text, weights

    ref, tok = weights.load_smollm2()
    return ref, text.chat_input_ids(tok, demo.DEFAULT_PROMPT)


def spyre_runs(model_name: str, runs: list[tuple[int, str]], new_tokens: int, groups: dict, args) -> dict:
    """Greedy decoding on emulated Spyre for every (degree, collectives) run; d > 1 also teacher-forced on TP=1's
    tokens (when TP=1 ran first). --device spyre moves the patched model onto this rank's card (spyre:LOCAL_RANK)."""
    import adapters
    from models.generate import StaticGreedy, device_copy
    from models.tensor_parallel import tensor_parallel

    rank = dist.get_rank()
    ref, ids = _load(model_name, args.prompt_seed)
    out: dict = {}
    tp1: list[int] | None = None
    for d, collectives in runs:
        torch._dynamo.reset()  # each run compiles its own shapes; no recompile limit across them
        record = None
        if rank < d:
            t0 = time.perf_counter()
            model = device_copy(ref, torch.float16)
            handle = tensor_parallel(model, group=_group(d, groups), world_size=d, collectives=collectives)
            patched = adapters.apply(model)  # on the CPU, before the move, as hf-adapters prepare a model
            if args.device == "spyre":
                model.to("spyre")
            runner = StaticGreedy(model)
            gen = runner.generate(ids, new_tokens)
            forced = runner.generate(ids, new_tokens, forced=tp1) if tp1 is not None and d > 1 else None
            patched.remove()
            record = {
                "rank": rank,
                "device": str(runner.device),
                "tokens": gen.new_ids,
                "forced_predictions": forced.new_ids if forced else None,
                "prefill_us": gen.prefill.sim_us,
                "decode_us": [s.sim_us for s in gen.decodes],
                "prompt_ids": ids[0].tolist(),
                "prefill_comm_us": gen.prefill.report.collective_us,
                "decode_comm_us": gen.steps[1].report.collective_us,
                "collectives_per_decode": len(gen.steps[1].report.collectives),
                "programs_per_decode": len(gen.steps[1].report.programs),
                "summary": handle.summary(),
                "collectives": handle.collectives,
                "wall_s": time.perf_counter() - t0,
            }
        records = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(record, records, dst=0)
        key = str(d) if collectives == "auto" else f"{d}:{collectives}"
        if rank == 0:
            out[key] = [r for r in records if r is not None]
        if d == 1:
            box = [gen.new_ids if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            tp1 = box[0]
    return out


def bad_degree(world: int) -> str:
    """The typed error for a degree that is not the process group's size."""
    from models import tiny
    from models.tensor_parallel import TensorParallelError, tensor_parallel

    try:
        tensor_parallel(tiny.tiny_llama(), world_size=world + 1)
    except TensorParallelError as e:
        return str(e)
    return "no error"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    ap.add_argument(
        "--tp", default="1,2", help="runs: DEGREE or DEGREE:COLLECTIVES (auto, graph, host), in order"
    )
    ap.add_argument("--device", default="spyre", choices=("spyre", "cpu"))
    ap.add_argument("--new-tokens", type=int, default=20)
    ap.add_argument("--families", default="")
    ap.add_argument("--prompt-seed", type=int, default=39)
    args = ap.parse_args()
    runs = [(int(d), mode or "auto") for d, _, mode in (x.partition(":") for x in args.tp.split(","))]
    degrees = sorted({d for d, _ in runs})
    warnings.simplefilter("ignore")
    # spyreccl for spyre tensors and compiled collectives where the stack has it, gloo for CPU tensors
    spyreccl = "spyreccl" in dist.Backend.backend_list
    dist.init_process_group("cpu:gloo,spyre:spyreccl" if spyreccl else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    doc: dict = {
        "world_size": world,
        "aiu_world_size": os.environ.get("AIU_WORLD_SIZE"),
        "spyreccl": spyreccl,
    }
    try:
        assert max(degrees) == world, f"--tp {args.tp} needs --nproc-per-node {max(degrees)}"
        # every rank creates every group, in the same order, as torch.distributed requires
        groups = {d: dist.new_group(list(range(d))) for d in degrees if d < world}
        t0 = time.perf_counter()
        families = [f for f in args.families.split(",") if f]
        if families:
            doc["cpu_families"] = cpu_families(families, degrees, groups)
        doc["cpu_families_wall_s"] = time.perf_counter() - t0
        doc["bad_degree"] = bad_degree(world)
        doc["spyre"] = spyre_runs(args.model, runs, args.new_tokens, groups, args)
    except Exception:
        doc["error"] = f"rank {rank}: {traceback.format_exc()}"
        sys.stderr.write(doc["error"])
        if rank != 0:
            raise
    if rank == 0:
        args.out.write_text(json.dumps(doc, indent=1))
    dist.destroy_process_group()
    if "error" in doc:
        sys.exit(1)


if __name__ == "__main__":
    main()
