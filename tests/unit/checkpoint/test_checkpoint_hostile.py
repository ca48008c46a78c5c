"""Hostile and damaged checkpoints (issue 20, items 6 and 7): every reader refuses, with one
CheckpointError naming the entry, any path that leaves the checkpoint (``..``, absolute
names, ``latest`` pointing elsewhere, symlinks out) and any manifest, position or .npy
header that does not hold together, before allocating anything."""
import copy
import io
import json
import os
import zlib

import numpy as np
import pytest
from numpy.lib import format as npformat

from paramshard.checkpoint import format as ckfmt
from paramshard.checkpoint.format import Checkpoint, CheckpointError, CheckpointWriter, write_trainer_position
from paramshard.checkpoint.npy import load_npy
from paramshard.client.checkpoint import open_for_resume
from paramshard.optim import Adagrad, Momentum, RowWiseAdagrad
from paramshard.tables import Admission, Eviction, policy_to_wire

STEP = 7
STEP_DIR = "step-00000007"
VALUES = "dense/p0.values.npy"


def make(root):
    """A small checkpoint shaped like a real one: one dense parameter [2, 3] with a
    Momentum slot, one sparse table of 3 rows of dim 4 with an Adagrad slot."""
    w = CheckpointWriter(root, STEP)
    w.put(VALUES, np.arange(6, dtype=np.float32))
    w.put("dense/p0.slot0.npy", np.zeros(6, np.float32))
    w.put("sparse/t0/ids.npy", np.array([1, 5, 9], np.uint64))
    w.put("sparse/t0/values.npy", np.ones((3, 4), np.float32))
    w.put("sparse/t0/slot0.npy", np.zeros((3, 4), np.float32))
    dense = [{"name": "w", "shape": [2, 3], "version": STEP,
              "files": {"values": VALUES, "slots": ["dense/p0.slot0.npy"]}}]
    sparse = [{"name": "emb", "dim": 4, "seed": 0, "init_scale": 0.01, "optimizer": Adagrad(lr=0.1).to_wire(),
               "policy": policy_to_wire(Admission(), Eviction(), 0.01), "rows": 3, "version": STEP, "evicted": 0,
               "files": {"ids": "sparse/t0/ids.npy", "values": "sparse/t0/values.npy",
                         "slot0": "sparse/t0/slot0.npy"}}]
    return w.commit({"mode": "sync", "servers": 1, "optimizer": Momentum(lr=0.1).to_wire(), "plan": {},
                     "dense": dense, "sparse": sparse})


def manifest_of(step_dir):
    return json.loads((step_dir / "manifest.json").read_text())


def rewrite(step_dir, manifest):
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


def refused(call, *needles) -> str:
    """The one-line CheckpointError ``call`` raises, which must contain every needle."""
    with pytest.raises(CheckpointError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def npy_bytes(array=None, header=None, data=b"") -> bytes:
    """A .npy file: ``array`` as numpy writes it, or a hand-made ``header`` followed by ``data``."""
    f = io.BytesIO()
    if array is not None:
        npformat.write_array(f, array, allow_pickle=False)
    else:
        npformat.write_array_header_1_0(f, header)
        f.write(data)
    return f.getvalue()


def file_meta(data: bytes, dtype: str, shape: list) -> dict:
    return {"bytes": len(data), "crc32": zlib.crc32(data), "dtype": dtype, "shape": shape}


def test_the_well_formed_checkpoint_reads_whole(tmp_path):
    path = make(tmp_path)
    ckpt = Checkpoint(tmp_path)
    assert ckpt.path == path and ckpt.step == STEP
    np.testing.assert_array_equal(ckpt.array("sparse/t0/values.npy"), np.ones((3, 4), np.float32))
    assert ckpt.trainer_position(0) is None


# ---------------------------------------------------------------- 6. paths stay inside

@pytest.mark.parametrize("name, problem", [("../../x.npy", "climbs out of the checkpoint"),
                                           ("dense/../../x.npy", "climbs out of the checkpoint"),
                                           ("/abs/x.npy", "is an absolute path"),
                                           ("dense/.hidden.npy", "is not a plain relative path"),
                                           ("dense//p0.npy", "is not a plain relative path")])
def test_a_manifest_entry_leaving_the_checkpoint_is_refused(tmp_path, name, problem):
    root = tmp_path / "ckpt"
    step = make(root)
    (tmp_path / "x.npy").write_bytes((step / VALUES).read_bytes())     # what the entry would have read
    m = manifest_of(step)
    m["files"][name] = m["files"].pop(VALUES)
    m["dense"][0]["files"]["values"] = name
    rewrite(step, m)
    refused(lambda: Checkpoint(root), str(step / "manifest.json"), f"file entry {name!r} {problem}")


def test_latest_naming_a_directory_outside_the_root_is_refused(tmp_path):
    make(tmp_path / "elsewhere")            # a whole, valid checkpoint: only its place is wrong
    root = tmp_path / "ckpt"
    root.mkdir()
    for name in ["../elsewhere", "../elsewhere/step-00000007", "/abs", "step-00000007\n", 7]:
        (root / "latest").write_text(json.dumps({"checkpoint": name}))
        refused(lambda: Checkpoint(root), str(root / "latest"), f"names {name!r}, not a step-NNNNNNNN directory")


def test_latest_naming_a_step_directory_linked_outside_the_root_is_refused(tmp_path):
    outside = make(tmp_path / "elsewhere")
    root = tmp_path / "ckpt"
    root.mkdir()
    os.symlink(outside, root / STEP_DIR)
    (root / "latest").write_text(json.dumps({"checkpoint": STEP_DIR}))
    refused(lambda: Checkpoint(root), f"step directory {STEP_DIR!r} resolves to {outside}", "refused")
    (root / "latest").unlink()         # found by scanning the root instead of through latest: the same
    refused(lambda: Checkpoint(root), f"step directory {STEP_DIR!r} resolves to {outside}")


def test_a_symlink_out_of_the_checkpoint_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    step = make(root)
    outside = tmp_path / "secret.npy"
    outside.write_bytes((step / VALUES).read_bytes())     # same bytes: size and CRC-32 would agree
    (step / VALUES).unlink()
    os.symlink(outside, step / VALUES)
    refused(lambda: Checkpoint(root).array(VALUES), f"file entry {VALUES!r} resolves to {outside}", "refused")
    # The manifest itself, linked out of the checkpoint.
    (tmp_path / "manifest.json").write_text((step / "manifest.json").read_text())
    (step / "manifest.json").unlink()
    os.symlink(tmp_path / "manifest.json", step / "manifest.json")
    refused(lambda: Checkpoint(root), "manifest 'manifest.json' resolves to")


def test_a_symlink_inside_the_checkpoint_is_followed(tmp_path):
    step = make(tmp_path)
    (step / "dense/real.npy").write_bytes((step / VALUES).read_bytes())
    (step / VALUES).unlink()
    os.symlink("real.npy", step / VALUES)
    np.testing.assert_array_equal(Checkpoint(tmp_path).array(VALUES), np.arange(6, dtype=np.float32))


def test_a_fifo_in_place_of_a_file_is_refused_without_waiting(tmp_path):
    step = make(tmp_path)
    (step / VALUES).unlink()
    os.mkfifo(step / VALUES)       # opening it for reading would wait for a writer forever
    refused(lambda: Checkpoint(tmp_path).array(VALUES), "is not a regular file")


# ---------------------------------------------------------------- 7. sizes and schema

def test_a_header_declaring_2_to_the_40_floats_is_refused_before_allocating(tmp_path):
    step = make(tmp_path)
    data = npy_bytes(header={"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)}, data=b"\0" * 24)
    (step / VALUES).write_bytes(data)
    m = manifest_of(step)
    m["files"][VALUES] = file_meta(data, "<f4", [1 << 40])          # the manifest agrees with the header
    m["dense"][0]["shape"] = [1 << 40]
    rewrite(step, m)
    # The old reader passed size and CRC-32, then np.load allocated 4 TiB: MemoryError.
    refused(lambda: Checkpoint(tmp_path), f"file entry {VALUES!r}: shape [1099511627776] of <f4 needs "
                                          f"4398046511104 bytes, the file has {len(data)}")


def test_the_npy_reader_itself_bounds_the_array_by_the_file_size(tmp_path):
    path = tmp_path / "big.npy"
    data = npy_bytes(header={"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)}, data=b"\0" * 24)
    path.write_bytes(data)
    refused(lambda: load_npy(path, file_meta(data, "<f4", [1 << 40])),
            str(path), "the header declares 4398046511104 bytes of data, the file holds 24")


@pytest.mark.parametrize("header, needle", [
    ({"descr": "|O", "fortran_order": False, "shape": (6,)}, "dtype |O, not one a checkpoint holds"),
    ({"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)}, "float32[1099511627776], the manifest says <f4[6]"),
    ({"descr": "<f8", "fortran_order": False, "shape": (3,)}, "dtype <f8, not one a checkpoint holds"),
    ({"descr": "<i8", "fortran_order": False, "shape": (3,)}, "int64[3], the manifest says <f4[6]"),
    ({"descr": "<f4", "fortran_order": True, "shape": (2, 3)}, "float32[2, 3], the manifest says <f4[6]"),
])
def test_a_header_disagreeing_with_the_manifest_is_refused(tmp_path, header, needle):
    step = make(tmp_path)
    data = npy_bytes(header=header, data=b"\0" * 24)
    (step / VALUES).write_bytes(data)
    m = manifest_of(step)
    m["files"][VALUES].update(bytes=len(data), crc32=zlib.crc32(data))     # size and CRC-32 agree
    rewrite(step, m)
    refused(lambda: Checkpoint(tmp_path).array(VALUES), str(step / VALUES), needle)


def test_a_file_that_is_no_npy_is_refused(tmp_path):
    step = make(tmp_path)
    data = b"PK\x03\x04 not an array" + b"\0" * 20
    (step / VALUES).write_bytes(data)
    m = manifest_of(step)
    m["files"][VALUES].update(bytes=len(data), crc32=zlib.crc32(data))
    rewrite(step, m)
    refused(lambda: Checkpoint(tmp_path).array(VALUES), "not a readable .npy header")


def _set(path, value):
    """A mutation of the manifest: set (or with ``...``, delete) the item at ``path``."""
    def apply(m):
        *parents, last = path
        target = m
        for key in parents:
            target = target[key]
        if value is ...:
            del target[last]
        else:
            target[last] = value
    return apply


MUTATIONS = {
    "no files": (_set(["files"], ...), "the manifest has no 'files'"),
    "files a list": (_set(["files"], []), "files must be a JSON object, got list"),
    "no dense": (_set(["dense"], ...), "the manifest has no 'dense'"),
    "step a string": (_set(["step"], "7"), "step must be a whole number >= 0, got '7'"),
    "step negative": (_set(["step"], -1), "step must be a whole number >= 0, got -1"),
    "bytes a float": (_set(["files", VALUES, "bytes"], 1.5), f"file entry {VALUES!r}: bytes must be a whole"),
    "crc out of range": (_set(["files", VALUES, "crc32"], 1 << 32), f"file entry {VALUES!r}: crc32 must be"),
    "object dtype": (_set(["files", VALUES, "dtype"], "|O"), "dtype '|O' is not one a checkpoint holds"),
    "nested shape": (_set(["files", VALUES, "shape"], [[6]]), f"file entry {VALUES!r}: shape[0] must be"),
    "no crc": (_set(["files", VALUES, "crc32"], ...), f"file entry {VALUES!r} has no 'crc32'"),
    "dense shape a string": (_set(["dense", 0, "shape"], "2x3"), "dense parameter 'w': shape must be a JSON list"),
    "dense shape disagrees": (_set(["dense", 0, "shape"], [3, 3]),
                              f"dense parameter 'w': values: {VALUES!r} is <f4[6], expected <f4[9]"),
    "dense file unlisted": (_set(["dense", 0, "files", "values"], "dense/p9.npy"),
                            "the manifest lists no file 'dense/p9.npy'"),
    "dense entry a list": (_set(["dense", 0], []), "dense[0] must be a JSON object, got list"),
    "dim a bool": (_set(["sparse", 0, "dim"], True), "sparse table 'emb': table 'emb': dim must be"),
    "rows disagree": (_set(["sparse", 0, "rows"], 4), "sparse table 'emb': ids: 'sparse/t0/ids.npy' is <u8[3], "
                                                      "expected <u8[4]"),
    "unknown part": (_set(["sparse", 0, "files", "../x"], "sparse/t0/ids.npy"), "files has '../x', not a part"),
    "counts alone": (_set(["sparse", 0, "files", "counts"], "sparse/t0/ids.npy"),
                     "files has 'counts' without 'counted_ids'"),
    "bad optimizer": (_set(["sparse", 0, "optimizer"], {"kind": "magic"}), "sparse table 'emb': optimizer"),
    "bad policy": (_set(["sparse", 0, "policy"], {}), "sparse table 'emb': bad table policy"),
    "bad row dtype": (_set(["sparse", 0, "dtype"], "float64"), "sparse table 'emb': table 'emb': rows are stored as "
                                                               "one of float32, float16, bfloat16, got 'float64'"),
    "row dtype a list": (_set(["sparse", 0, "dtype"], ["float16"]), "rows are stored as one of"),
    "bad rounding": (_set(["sparse", 0, "rounding"], "up"), "sparse table 'emb': table 'emb': rounding is one of"),
    "lr_scale zero": (_set(["lr_scale"], 0), "lr_scale must be a finite number > 0 (a learning-rate scale), got 0"),
    "lr_scale a string": (_set(["sparse", 0, "lr_scale"], "0.5"), "sparse table 'emb': lr_scale must be a finite"),
    "table twice": (lambda m: m["sparse"].append(copy.deepcopy(m["sparse"][0])), "sparse lists 'emb' twice"),
    "cut not a number": (_set(["cut"], {"x": 1}), "cut: 'x' is not a trainer number"),
    # The recorded model (specs/model_spec.py): checked like the rest, before export-model or predict use it.
    "model a list": (_set(["model"], []), "model: the model spec must be an object, got list"),
    "model without a name": (_set(["model"], {"args": {}}), "model: the model spec's 'model' must be a non-empty"),
    "model schema broken": (_set(["model"], {"model": "lr", "args": {}, "schema": {"label": "y"}}),
                            "model: the model spec's schema: missing 'columns'"),
    "model key unknown": (_set(["model"], {"model": "lr", "args": {}, "code": "import os"}),
                          "model: the model spec has an unknown key 'code'"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_manifest_off_its_schema_is_one_line_naming_the_field(tmp_path, case):
    mutate, needle = MUTATIONS[case]
    step = make(tmp_path)
    m = manifest_of(step)
    mutate(m)
    rewrite(step, m)
    refused(lambda: Checkpoint(tmp_path), str(step / "manifest.json"), needle)


def make_row_wise(root, slots):
    """The checkpoint of make() with its table's optimizer RowWiseAdagrad and ``slots`` (part name ->
    array) as the table's state files."""
    step = make(root)
    m = manifest_of(step)
    w = CheckpointWriter(root, STEP + 1)
    for relpath in m["files"]:
        w.put(relpath, Checkpoint(step).array(relpath))
    table = m["sparse"][0]
    table["optimizer"] = RowWiseAdagrad(lr=0.1).to_wire()
    del table["files"]["slot0"]
    for part, arr in slots.items():
        table["files"][part] = f"sparse/t0/{part}.npy"
        w.put(table["files"][part], arr)
    return w.commit({k: v for k, v in m.items() if k not in ("format", "version", "step", "files", "created")})


def test_a_row_wise_table_has_one_accumulator_column_per_row(tmp_path):
    make_row_wise(tmp_path / "good", {"slot0": np.full((3, 1), 0.5, np.float32)})
    ckpt = Checkpoint(tmp_path / "good")
    np.testing.assert_array_equal(ckpt.array("sparse/t0/slot0.npy"), np.full((3, 1), 0.5, np.float32))
    make_row_wise(tmp_path / "wide", {"slot0": np.zeros((3, 4), np.float32)})    # a per-element slot
    refused(lambda: Checkpoint(tmp_path / "wide"), "sparse table 'emb': slot0: 'sparse/t0/slot0.npy' is <f4[3, 4], "
                                                   "expected <f4[3, 1]")
    make_row_wise(tmp_path / "extra", {"slot0": np.zeros((3, 1), np.float32), "slot1": np.zeros((3, 1), np.float32)})
    refused(lambda: Checkpoint(tmp_path / "extra"), "files has 'slot1', but rowwise_adagrad keeps 1 state array per row")


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000 + "]" * 100_000, "unreadable manifest"),          # RecursionError in json, not a traceback
    ('{"format": "paramshard-checkpoint", "version": 1, "step": 1' + "0" * 5000 + "}", "unreadable manifest"),
    ("[]", "not a paramshard checkpoint manifest"),
    ('{"format": "paramshard-checkpoint", "version": 2}', "format version 2, this paramshard reads version 1"),
])
def test_a_manifest_that_is_no_manifest_is_one_line(tmp_path, text, needle):
    step = make(tmp_path)
    (step / "manifest.json").write_text(text)
    refused(lambda: Checkpoint(tmp_path), needle)


def test_a_manifest_over_the_size_bound_is_not_parsed(tmp_path, monkeypatch):
    step = make(tmp_path)
    size = (step / "manifest.json").stat().st_size
    monkeypatch.setattr(ckfmt, "MAX_MANIFEST_BYTES", size - 1)
    refused(lambda: Checkpoint(tmp_path), f"the manifest is {size} bytes, more than the {size - 1}")


def test_resume_refuses_a_hostile_checkpoint_and_a_far_trainer_skips_it(tmp_path):
    step = make(tmp_path)
    m = manifest_of(step)
    del m["files"]
    rewrite(step, m)
    refused(lambda: open_for_resume(tmp_path, required=True), "has no 'files'")
    assert open_for_resume(tmp_path, required=False) is None


# ---------------------------------------------------------------- trainer positions

def _position():
    from paramshard.trainer.position import capture
    return capture(STEP, {"next_batch": 3})


def test_a_trainer_position_reads_back(tmp_path):
    make(tmp_path)
    write_trainer_position(tmp_path, STEP, 1, _position())
    assert Checkpoint(tmp_path).trainer_position(1)["state"] == {"next_batch": 3}


POSITION_MUTATIONS = {
    "a list": (lambda p: [p], "the position must be a JSON object"),
    "no state": (_set(["state"], ...), "the position has no 'state'"),
    "another step": (_set(["step"], STEP + 1), f"step is {STEP + 1}, the checkpoint's is {STEP}"),
    "torch not base64": (_set(["rng", "torch"], "!!"), "rng.torch is not base64"),
    "torch state short": (_set(["rng", "torch"], "AAAA"), "rng.torch holds 3 bytes"),
    "numpy keys short": (_set(["rng", "numpy", 1], "AAAA"), "rng.numpy keys must be 624 32-bit words"),
    "numpy pos huge": (_set(["rng", "numpy", 2], 1 << 40), "rng.numpy pos must be a whole number 0..624"),
    "python word a string": (_set(["rng", "python", 1, 5], "x"), "rng.python internal state[5] must be"),
    "python state short": (_set(["rng", "python", 1], [1, 2]), "must hold 625 numbers, got 2"),
    "stream not an object": (_set(["stream"], [1]), "stream must be a JSON object, got list"),
}


@pytest.mark.parametrize("case", sorted(POSITION_MUTATIONS))
def test_a_damaged_trainer_position_is_one_line_naming_the_field(tmp_path, case):
    mutate, needle = POSITION_MUTATIONS[case]
    make(tmp_path)
    position = _position()
    position = mutate(position) or position
    write_trainer_position(tmp_path, STEP, 0, position)
    refused(lambda: Checkpoint(tmp_path).trainer_position(0), f"trainers/{STEP_DIR}/trainer-0.json", needle)


def test_a_trainer_position_linked_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    make(root)
    (tmp_path / "p.json").write_text(json.dumps(_position()))
    (root / "trainers" / STEP_DIR).mkdir(parents=True)
    os.symlink(tmp_path / "p.json", root / "trainers" / STEP_DIR / "trainer-0.json")
    refused(lambda: Checkpoint(root).trainer_position(0), "trainer position", "resolves to", "refused")


# ---------------------------------------------------------------- the command

def test_a_table_entry_records_its_row_format_and_one_without_is_float32(tmp_path):
    """Checkpoints written before half-precision rows name no dtype: they load as float32 rows
    rounded to nearest, and resume only into such a table."""
    from paramshard.client.checkpoint import check_fits, table_spec_from_manifest
    from paramshard.client.sparse import TableSpec
    from paramshard.placement.sharding import ParamSpec, make_plan

    step = make(tmp_path / "old")
    entry = Checkpoint(tmp_path / "old").manifest["sparse"][0]
    assert "dtype" not in entry and "rounding" not in entry
    spec = table_spec_from_manifest(entry)
    assert (spec.dtype, spec.rounding) == ("float32", "nearest")
    plan = make_plan([ParamSpec("w", (2, 3))], 1, "balanced", 1)
    check_fits(Checkpoint(tmp_path / "old"), plan, Momentum(lr=0.1), {"emb": spec})
    half = TableSpec("emb", 4, Adagrad(lr=0.1), dtype="float16")
    with pytest.raises(CheckpointError, match="sparse table 'emb' keeps float16 rows \\(nearest rounding\\) here, "
                                              "float32 \\(nearest\\) in the checkpoint"):
        check_fits(Checkpoint(tmp_path / "old"), plan, Momentum(lr=0.1), {"emb": half})
    m = manifest_of(step)
    m["sparse"][0].update(dtype="bfloat16", rounding="stochastic")
    rewrite(step, m)
    spec = table_spec_from_manifest(Checkpoint(tmp_path / "old").manifest["sparse"][0])
    assert (spec.dtype, spec.rounding) == ("bfloat16", "stochastic")
    check_fits(Checkpoint(tmp_path / "old"), plan, Momentum(lr=0.1), {"emb": spec})
