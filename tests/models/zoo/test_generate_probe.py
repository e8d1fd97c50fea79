"""The generation probe: greedy tokens of a decoder or encoder-decoder LM moved to the device against CPU fp32, one
record per type, appended as it goes and resumed."""

import json

import torch

from models.zoo import generate_probe


def test_probe_records_each_type_and_resumes(tmp_path, capsys):
    out = tmp_path / "generate.jsonl"
    assert generate_probe.main([str(out), "--only", "llama,hrm_text,bert,marian"]) == 0
    records = {r["model_type"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["llama"]["status"] == "same" and records["llama"]["rows_same"] == records["llama"]["rows"] >= 1
    # hrm_text's own generate breaks on the CPU (transformers' cache), so the device is not blamed
    assert records["hrm_text"]["status"] == "cpu_fails"
    assert records["bert"]["status"] == "not_lm"
    # MarianMTModel from the zoo's config; its forced EOS runs on the host (host_generate)
    assert records["marian"]["kind"] == "seq2seq" and records["marian"]["status"] == "same"
    assert generate_probe.main([str(out), "--only", "llama"]) == 0  # already there: not run again
    assert len(out.read_text().splitlines()) == 4
    assert "4 records" in capsys.readouterr().out


def test_seeded_sampling_draws_the_cpus_tokens_and_modes_keep_their_files(tmp_path, capsys):
    greedy, sampled = tmp_path / "greedy.jsonl", tmp_path / "sample.jsonl"
    assert generate_probe.main([str(sampled), "--only", "llama", "--sample", "--new-tokens", "4"]) == 0
    (record,) = map(json.loads, sampled.read_text().splitlines())
    assert (record["mode"], record["status"]) == ("sample", "same")
    assert generate_probe.main([str(sampled), "--only", "llama"]) == 2  # greedy records into the sample file
    assert "holds sample records" in capsys.readouterr().err
    assert not greedy.exists()


def test_beam_mode_keeps_the_cpus_beams(tmp_path):
    """Three greedy beams: the beams' bookkeeping and the cache's reorder on the host each step (an encoder-decoder's
    too: tests/adapters/test_generation.py)."""
    out = tmp_path / "beam.jsonl"
    assert generate_probe.main([str(out), "--only", "llama", "--mode", "beam"]) == 0
    (record,) = map(json.loads, out.read_text().splitlines())
    assert (record["mode"], record["kind"], record["status"]) == ("beam", "decoder", "same")


def test_a_speech_model_is_probed_as_an_encoder_decoder_from_its_features():
    from models.zoo.recipes import build

    kind, model, inputs, rows = generate_probe._lm(build("whisper", "default", 0), "whisper", 0)
    assert (kind, type(model).__name__) == ("seq2seq", "WhisperForConditionalGeneration")
    assert "input_features" in inputs and not {"decoder_input_ids", "input_ids"} & set(inputs) and rows == [0, 1]
    assert "whisper" in generate_probe.lm_types() and "speech_to_text" in generate_probe.lm_types()


def test_a_sampled_difference_is_traced_to_a_moved_cut_or_a_draw():
    inf = float("-inf")
    ids = torch.tensor([[5, 1, 2], [5, 1, 2]])
    kept = [torch.tensor([[0.5, 0.4, inf], [0.5, 0.4, inf]])] * 2
    ref = (ids, kept, None)
    other = ids.clone()
    other[0, 2] = 3
    # row 0 parts at the second new token: the same kept set there (a draw), then one where the cut moved
    assert not generate_probe._cut_moved(ref, (other, kept, None), 0)
    moved = [kept[0], torch.tensor([[0.5, inf, 0.4], [0.5, 0.4, inf]])]
    assert generate_probe._cut_moved(ref, (other, moved, None), 0)
    assert not generate_probe._cut_moved(ref, (ids, moved, None), 1)  # a row that does not part


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert generate_probe.main([str(tmp_path / "x.jsonl"), "--new-tokens", "0"]) == 2
    assert generate_probe.main([str(tmp_path / "x.jsonl"), "--only", "no_such_type"]) == 2
    assert generate_probe.main([str(tmp_path / "x.jsonl"), "--sample", "--mode", "beam"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert not (tmp_path / "x.jsonl").exists()


def test_a_model_past_the_wall_limit_is_a_timeout_not_its_error(tmp_path):
    """SIGALRM fires inside the device run, where probe_one records the model's own exceptions: the timeout must
    pass through them."""
    out = tmp_path / "t.jsonl"
    (record,) = generate_probe.probe(out, ["llama"], new_tokens=200, timeout_s=1, mode="sample")
    assert (record["status"], record["mode"]) == ("timeout", "sample"), record
    # the file resumes in its mode (a timeout record without one read as greedy and the sample file was refused)
    assert generate_probe.main([str(out), "--only", "llama", "--sample"]) == 0
