"""Generation on the device, the real stack's flow, for the zoo's decoder and encoder-decoder LMs.

The sweep judges one forward. Generation adds what a forward never meets: the cache's updates, the logits
processors, the stopping criteria, GenerationMixin's bookkeeping, all of it eager on spyre tensors. For each LM type
(the zoo's tiny random-weight model and inputs, models.zoo.recipes.build; an encoder-decoder type's seq2seq-LM or
speech-to-text class built from the zoo's config, seeded): CPU fp32 greedy generation of a few tokens is the
reference; the same model in fp16 with the adapters applied on the CPU is moved with `Module.to("spyre")` and
generates from the inputs on the device. A decoder's rows without padding are compared (the zoo's inputs pad one row
on the right, where generation continues from a pad position: the audio LMs of the seq2seq mapping too); an
encoder-decoder's every row (its decoder starts from its own token).

Each record: `status` = `same` (every compared row's tokens equal the reference), `differs`, `error` (the device run
raised: `class` and `blocking` as the sweep's classify_error gives them, `error`), `cpu_fails` (the reference itself
raised: the model's own generate), `not_buildable`, `not_lm` or `timeout`; `mode` (`greedy`, `sample`, `beam`), `kind`
(`decoder` or `seq2seq`), `rows`, `rows_same`, `wall_s`; a sampled `differs` has `cut_moved` (at the first step where
each differing row parts, the warpers kept different tokens: a near-tie at the top-k / top-p cut). Results are
appended (and flushed) per model, so an interrupted probe resumes where it stopped (one file per mode).

With `--sample` both runs sample (top-k 8, top-p 0.9, temperature 0.8) after the same `torch.manual_seed`, which
seeds the device's generator as the CPU's: the warpers and the draw run on host copies of the device's scores (the
host_generate adapter), so a token differs only where fp16 rounding moved a probability: across the top-k / top-p
cut (`cut_moved`; the zoo's random weights give flat distributions, full of near-ties) or across a draw.

With `--mode beam` both runs are a greedy beam search of three beams: the running beams' bookkeeping (floor
division, take_along_dim) and the cache's reorder each step (index_select of every layer's rows) on the host, the
forwards on the device (host_generate again); a token differs where fp16 moved a beam's accumulated score across
another's: a differing record has `beam_scores` (each differing row's best beam score, CPU and device).

Run: .venv/bin/python -m models.zoo.generate_probe OUT.jsonl [--only llama,t5] [--new-tokens 3] [--timeout 240]
     [--mode greedy|sample|beam] (`--sample` is `--mode sample`)
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree


class _Timeout(BaseException):
    """The wall limit (SIGALRM). Not an Exception: probe_one's except clauses, which record the model's errors,
    must let it through to `probe`, which records a timeout."""


# sample: seeded top-k/top-p sampling (the logits warpers and the draw: the host_generate adapter's work)
SAMPLING = {"do_sample": True, "top_k": 8, "top_p": 0.9, "temperature": 0.8}
# the generate() arguments of each mode; the beams are set whatever the generation config says (FSMT's says 5)
MODES = {
    "greedy": {"do_sample": False, "num_beams": 1},
    "sample": {**SAMPLING, "num_beams": 1},
    "beam": {"do_sample": False, "num_beams": 3},
}


def _generate(model, inputs: dict, new_tokens: int, mode: str, seed: int):
    """(tokens, each step's processed scores on the CPU) of `mode`'s generation; the attention mask is passed when
    the model's generate takes one."""
    kwargs = {"max_new_tokens": new_tokens, **MODES[mode], "output_scores": True, "return_dict_in_generate": True}
    torch.manual_seed(seed)  # seeds the device's generator too: both runs draw the same numbers
    try:
        out = model.generate(**inputs, **kwargs)
    except ValueError as e:
        if "attention_mask" not in inputs or "model_kwargs" not in str(e) or "attention_mask" not in str(e):
            raise
        torch.manual_seed(seed)
        out = model.generate(**{k: v for k, v in inputs.items() if k != "attention_mask"}, **kwargs)
    beam_scores = getattr(out, "sequences_scores", None)  # beam mode: each returned beam's length-normalised score
    return out.sequences.cpu(), [s.cpu() for s in out.scores], None if beam_scores is None else beam_scores.cpu()


def _cut_moved(ref, got, row: int) -> bool:
    """At the first step where a sampled row's tokens part, did the warpers keep different tokens (a near-tie at the
    top-k / top-p cut that fp16 rounding moved) rather than the same set with a different draw?"""
    (ref_ids, ref_scores, _), (got_ids, got_scores, _) = ref, got
    steps = len(ref_scores)
    parted = (ref_ids[row, -steps:] != got_ids[row, -steps:]).nonzero()
    if not len(parted) or len(got_scores) != steps:
        return False
    i = int(parted[0])
    return not torch.equal(ref_scores[i][row].isfinite(), got_scores[i][row].isfinite())


def _lm(zm, model_type: str, seed: int):
    """(kind, model, generate inputs, compared rows) of a zoo build, or None when the type is no LM here."""
    from models.zoo import catalog

    ids, mask = zm.inputs.get("input_ids"), zm.inputs.get("attention_mask")
    if zm.is_decoder_lm and ids is not None:
        inputs = {"input_ids": ids} if mask is None else {"input_ids": ids, "attention_mask": mask}
        return "decoder", zm.model, inputs, _unpadded(mask, ids.shape[0])
    name = catalog.seq2seq_lm_class_name(model_type) or catalog.speech_seq2seq_class_name(model_type)
    if name is None:
        return None
    if type(zm.model).__name__ != name:
        import transformers

        torch.manual_seed(seed)
        model = getattr(transformers, name)(zm.model.config)
    else:
        model = zm.model
    # the encoder's inputs; the decoder's own (decoder_input_ids, labels) are generate's to make
    inputs = {k: v for k, v in zm.inputs.items() if not k.startswith("decoder_") and k != "labels"}
    if getattr(model.config, "is_encoder_decoder", False):
        gc = model.generation_config
        if gc.decoder_start_token_id is None and gc.bos_token_id is None:
            # T5's convention (its checkpoints' configs start the decoder at the pad id); the tiny configs leave it out
            gc.decoder_start_token_id = model.config.pad_token_id
        # every row: the decoder starts from its own token (a speech model's encoder takes features, not ids)
        batch = next(v for v in inputs.values() if isinstance(v, torch.Tensor)).shape[0]  # inputs hold use_cache too
        return "seq2seq", model, inputs, list(range(batch))
    if ids is None:
        return None
    # the audio LMs of the seq2seq mapping (Qwen2-Audio, Granite Speech) decode from their own prompt
    return "decoder", model, inputs, _unpadded(mask, ids.shape[0])


def _unpadded(mask: torch.Tensor | None, rows: int) -> list[int]:
    return [r for r in range(rows) if mask is None or bool(mask[r].all())]


def probe_one(model_type: str, new_tokens: int = 3, seed: int = 0, mode: str = "greedy") -> dict:
    """One model type's record (see the module docstring); exceptions of the model become its record."""
    import adapters
    from models.zoo.classify import _error, _half_inputs, classify_error
    from models.zoo.recipes import ZooBuildError, build

    rec: dict = {"model_type": model_type, "mode": mode}
    try:
        zm = build(model_type, "default", seed)
        lm = _lm(zm, model_type, seed)
    except ZooBuildError as e:
        return {**rec, "status": "not_buildable", "error": str(e).splitlines()[0]}
    except Exception as e:  # noqa: BLE001 - the seq2seq class refusing the zoo's config
        return {**rec, "status": "not_buildable", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    if lm is None:
        return {**rec, "status": "not_lm"}
    kind, lm_model, inputs, rows = lm
    rec.update(kind=kind, rows=len(rows))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FallbackWarnings of the model's CPU islands, transformers' notices
        try:
            ref = _generate(copy.deepcopy(lm_model).eval(), inputs, new_tokens, mode, seed)
        except Exception as e:  # noqa: BLE001 - the model's own generate
            return {**rec, "status": "cpu_fails", "error": _error(e)}
        model = copy.deepcopy(lm_model).half().eval()
        try:
            with adapters.apply(model):
                model.to("spyre")
                device_inputs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("spyre"), _half_inputs(inputs))
                got = _generate(model, device_inputs, new_tokens, mode, seed)
        except Exception as e:  # noqa: BLE001 - the record says what stopped it
            cls, blocking = classify_error(e)
            return {**rec, "status": "error", "class": cls, "blocking": blocking, "error": _error(e)}
    same = [r for r in rows if got[0].shape == ref[0].shape and torch.equal(got[0][r], ref[0][r])]
    rec["rows_same"] = len(same)
    rec["status"] = "same" if len(same) == len(rows) else "differs"
    if mode == "sample" and rec["status"] == "differs" and got[0].shape == ref[0].shape:
        rec["cut_moved"] = all(_cut_moved(ref, got, r) for r in rows if r not in same)
    if mode == "beam" and rec["status"] == "differs" and got[2] is not None:
        # the best beam's score on each side, per differing row: close scores are a near-tie fp16 moved
        differing = [r for r in rows if r not in same]
        rec["beam_scores"] = {"cpu": [round(float(ref[2][r]), 5) for r in differing],
                              "device": [round(float(got[2][r]), 5) for r in differing]}  # fmt: skip
    return rec


def lm_types() -> list[str]:
    """The model types with a causal-LM, seq2seq-LM or speech-to-text class: the candidates (build and _lm decide
    which are LMs)."""
    from models.zoo import catalog

    classes = (catalog.causal_lm_class_name, catalog.seq2seq_lm_class_name, catalog.speech_seq2seq_class_name)
    return [t for t in catalog.model_types() if any(name(t) for name in classes)]


def _alarm(_signum, _frame):
    raise _Timeout()


def probe(out: Path, types: list[str], new_tokens: int, timeout_s: int, mode: str = "greedy") -> list[dict]:
    """Probe `types` not yet in `out`, appending each record; returns every record in `out`."""
    done = {json.loads(line)["model_type"] for line in out.read_text().splitlines() if line} if out.exists() else set()
    signal.signal(signal.SIGALRM, _alarm)
    with out.open("a") as f:
        for t in (t for t in types if t not in done):
            start = time.perf_counter()
            signal.alarm(timeout_s)
            try:
                rec = probe_one(t, new_tokens, mode=mode)
            except _Timeout:
                rec = {"model_type": t, "mode": mode, "status": "timeout"}  # main() reads the mode back
            finally:
                signal.alarm(0)
            rec["wall_s"] = round(time.perf_counter() - start, 1)
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            print(f"{t}: {rec['status']}" + (f" ({rec.get('class')})" if rec["status"] == "error" else ""), flush=True)
    return [json.loads(line) for line in out.read_text().splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.zoo.generate_probe", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSONL results file (appended to; resumes)")
    parser.add_argument("--only", default=None, help="comma-separated model types (default: every LM type)")
    parser.add_argument("--new-tokens", type=int, default=3, help="tokens to generate (default 3)")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per model type (default 240)")
    parser.add_argument("--mode", choices=sorted(MODES), default=None, help="greedy (default), sample or beam")
    parser.add_argument("--sample", action="store_true", help=f"--mode sample: seeded sampling {SAMPLING}")
    args = parser.parse_args(argv)
    if args.new_tokens < 1 or args.timeout < 1:
        print(f"error: --new-tokens and --timeout must be at least 1, got {args.new_tokens} and {args.timeout}",
              file=sys.stderr)  # fmt: skip
        return 2
    types = [t.strip() for t in args.only.split(",") if t.strip()] if args.only else lm_types()
    from models.zoo import catalog

    unknown = sorted(set(types) - set(catalog.model_types()))
    if unknown:
        print(f"error: unknown model type(s) {', '.join(unknown)}; see models.zoo.model_types()", file=sys.stderr)
        return 2
    lines = args.out.read_text().splitlines() if args.out.exists() else []
    modes = {json.loads(line).get("mode", "greedy") for line in lines if line}  # records before --sample: greedy
    if args.sample and args.mode not in (None, "sample"):
        print(f"error: --sample is --mode sample; it contradicts --mode {args.mode}", file=sys.stderr)
        return 2
    mode = "sample" if args.sample else args.mode or "greedy"
    if modes - {mode}:
        print(f"error: {args.out} holds {', '.join(sorted(modes))} records; write {mode} records to another file",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        records = probe(args.out, types, args.new_tokens, args.timeout, mode)
    except KeyboardInterrupt:
        print(f"interrupted: the records so far are in {args.out}; run the same command to resume", file=sys.stderr)
        return 130
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{len(records)} records in {args.out}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
