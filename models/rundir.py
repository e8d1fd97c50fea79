"""The files of one greedy-decoding run, written as it goes so that a killed run can be resumed (`demo --resume`).

- run.json: the job (model, weights, prompt, max_new_tokens, hardware config token ...), written first;
- steps.jsonl: one JSON line per generated token, appended and flushed after each step;
- decode_state.safetensors: the KV cache after the last completed step, replaced atomically after each step (the
  device's own bits, so that the continued run is exactly the uninterrupted one; see generate.Checkpoint).

Resuming needs the same job, field by field. A truncated last line of steps.jsonl (killed mid-write) is dropped, and
so are lines past the saved KV cache (killed between the two writes): those steps are recomputed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch

from models.generate import Checkpoint, Generation, ResumeError, StaticGreedy, StepRecord

RUN_FILE = "run.json"
STEPS_FILE = "steps.jsonl"
STATE_FILE = "decode_state.safetensors"
FORMAT_VERSION = 1  # of these three files; part of the job, so runs written by another format are not resumed


class RunDirectory:
    """One run's files in `out`; `job` is a JSON-able dict that identifies the run (strings, numbers)."""

    def __init__(self, out: Path, job: dict):
        self.out = Path(out)
        self.job = {"format": FORMAT_VERSION, **job}
        self._steps: IO[str] | None = None

    def start(self) -> None:
        """A new run: forget any previous one in `out`, then record the job."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / STATE_FILE).unlink(missing_ok=True)
        self._steps = (self.out / STEPS_FILE).open("w")
        _write_atomically(self.out / RUN_FILE, json.dumps(self.job, indent=2) + "\n")

    def resume(self) -> Checkpoint | None:
        """Where the previous run of this job stopped; None if there is nothing to continue (then call start()).

        Raises ResumeError if `out` holds another job or files that do not fit together."""
        run_file = self.out / RUN_FILE
        if not run_file.exists():
            return None
        try:
            previous = json.loads(run_file.read_text())
        except (OSError, ValueError) as e:
            raise ResumeError(f"{run_file} is unreadable ({e}); run without --resume to start over") from None
        differences = job_differences(previous, self.job)
        if differences:
            raise ResumeError(
                f"{self.out} holds a different run, so it cannot be resumed: {'; '.join(differences)}. "
                "Use another --out, or run without --resume to replace it."
            )
        state = self._read_state()
        if state is None:  # killed before its first step completed
            return None
        done, kv = state
        lines = self._complete_lines()
        if len(lines) < done:
            raise ResumeError(
                f"{self.out / STEPS_FILE} has {len(lines)} complete steps but the saved KV cache is after step "
                f"{done}; the files do not fit together. Run without --resume to start over."
            )
        lines = lines[:done]  # later ones are recomputed: their KV cache was not saved
        _write_atomically(self.out / STEPS_FILE, "".join(line + "\n" for line in lines))
        records = [_record(json.loads(line), i) for i, line in enumerate(lines)]
        self._steps = (self.out / STEPS_FILE).open("a")
        return Checkpoint(records, kv)

    def log_step(self, rec: StepRecord, text: str) -> None:
        assert self._steps is not None, "start() or resume() first"
        line = {
            "kind": rec.kind,
            "position": rec.position,
            "token": rec.token,
            "text": text,
            "sim_us": rec.sim_us,
            "wall_s": round(rec.wall_s, 3),
        }
        self._steps.write(json.dumps(line) + "\n")
        self._steps.flush()

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """The KV cache after len(checkpoint.steps) steps; call after the last step's log_step."""
        from safetensors.torch import save_file

        path = self.out / STATE_FILE
        temp = path.with_name(f".{path.name}.tmp")
        tensors = {f"kv.{i}": t.contiguous() for i, t in enumerate(checkpoint.kv)}
        save_file(tensors, str(temp), metadata={"steps": str(len(checkpoint.steps)), "job": self._job_text()})
        os.replace(temp, path)  # a kill mid-write leaves the previous state whole

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()
            self._steps = None

    def generate(
        self,
        runner: StaticGreedy,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        eos_token_id: int | None,
        text: Callable[[int], str],
        resume_from: Checkpoint | None,
        trace_dir: str | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> Generation:
        """runner.generate with every step logged and checkpointed here; `text` renders a token for the log."""

        def log(rec: StepRecord) -> None:
            self.log_step(rec, text(rec.token))
            if on_step is not None:
                on_step(rec)

        try:
            return runner.generate(
                prompt_ids,
                max_new_tokens,
                eos_token_id,
                trace_dir=trace_dir,
                on_step=log,
                on_checkpoint=self.save_checkpoint,
                resume=resume_from,
            )
        finally:
            self.close()

    # --- reading ---------------------------------------------------------------------------------------------
    def _job_text(self) -> str:
        return json.dumps(self.job, sort_keys=True)

    def _read_state(self) -> tuple[int, tuple[torch.Tensor, ...]] | None:
        from safetensors import safe_open

        path = self.out / STATE_FILE
        if not path.exists():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                count = len(list(f.keys()))
                kv = tuple(f.get_tensor(f"kv.{i}") for i in range(count))
            done = int(meta["steps"])
        except Exception as e:  # unreadable in any way: say so, do not guess
            raise ResumeError(
                f"{path} is unreadable ({type(e).__name__}: {e}); run without --resume to start over"
            ) from None
        if meta.get("job") != self._job_text():
            raise ResumeError(
                f"{path} was saved by another run than {self.out / RUN_FILE} describes; "
                "run without --resume to start over"
            )
        return done, kv

    def _complete_lines(self) -> list[str]:
        """steps.jsonl's lines up to the first incomplete one (no newline yet, or not valid JSON)."""
        path = self.out / STEPS_FILE
        if not path.exists():
            return []
        lines = []
        for line in path.read_text().split("\n")[:-1]:  # the piece after the last newline is never complete
            try:
                json.loads(line)
            except ValueError:
                break
            lines.append(line)
        return lines


def job_differences(previous: dict, job: dict) -> list[str]:
    """What differs between two jobs, one phrase per field, e.g. "max_new_tokens: 32 there, 48 now"."""
    out = []
    for key in sorted(previous.keys() | job.keys()):
        was, now = previous.get(key), job.get(key)
        if was == now:
            continue
        if key == "hardware_config" and isinstance(was, str) and isinstance(now, str):
            out.append(f"hardware config: {_config_differences(was, now)}")
        else:
            out.append(f"{key}: {_short(was)} there, {_short(now)} now")
    return out


def _config_differences(was: str, now: str) -> str:
    """The differing fields of two HardwareConfig tokens (canonical JSON of every field)."""
    try:
        a, b = json.loads(was), json.loads(now)
    except ValueError:
        return "another configuration"
    fields = [
        f"{k} {_short(a.get(k))} there, {_short(b.get(k))} now"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]
    return ", ".join(fields)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _record(line: dict, index: int) -> StepRecord:
    try:
        return StepRecord(line["kind"], line["position"], line["token"], line["sim_us"], line["wall_s"])
    except (KeyError, TypeError) as e:
        raise ResumeError(
            f"line {index + 1} of {STEPS_FILE} is not a step record (missing {e}); run without --resume to start over"
        ) from None


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)
