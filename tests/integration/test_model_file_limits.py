"""A model file's sizes decide nothing about what reading it allocates (issue 30, L10):
hostile spec sizes, tensors larger than the data present, a DEFLATE bomb and a central
directory that lies are each refused with a ModelFileError naming the file and the field
or member, by load_model and by `paramshard predict`, and the refusal allocates nothing
big (tracemalloc for numpy and Python, peak RSS for torch's own allocator)."""
import copy
import os
import resource
import subprocess
import sys
import tracemalloc
import types

import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard.specs.schema import Column, Label, Schema
from paramshard.models import build_model, hashed_embedding
from paramshard.inference.serving import ModelFileError, model_dict, sparse_entry, write_model_file
from paramshard.trainer.sparse_embedding import tables_of
from paramshard.errors import ConfigError
from paramshard.export import load_table, save_table
from tests.integration.hostile_model_files import (TensorRef, StorageRef, deflated_zeros, npy_header, stored,
                                                   take_apart, write_model, write_zip)

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

SCHEMA = Schema(Label("y"), [Column("x"), Column("c", "categorical"), Column("d", "categorical")])
GiB = 1 << 30
ADMIT = types.SimpleNamespace(min_count=1, probability=1.0)
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def model_of(module) -> dict:
    torch.manual_seed(0)
    dense = {n: p.detach().numpy().copy() for n, p in module.named_parameters()}
    sparse = {name: sparse_entry(np.array([3, 9], np.uint64), np.ones((2, t.dim), np.float32), t.dim, 0, 0.01,
                                 "float32", ADMIT) for name, t in tables_of(module).items()}
    return model_dict(7, None, dense, sparse, module.paramshard_spec)


@pytest.fixture(scope="module")
def model():
    return model_of(build_model("widedeep", SCHEMA, dim=3, hidden=(5,)))


@pytest.fixture(scope="module")
def hashed_model():
    return model_of(build_model("widedeep", SCHEMA, dim=3, hidden=(5,), embedding=hashed_embedding(16)))


def refused_cheaply(path, match):
    """load_model(path) raises ModelFileError matching ``match`` with no big allocation (measured
    on a second refusal: the first may import modules, e.g. torch's meta-device machinery)."""
    with pytest.raises(ModelFileError, match=match):
        ps.load_model(path)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match=match):
            ps.load_model(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak:,} bytes traced while refusing {path}"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown < 256 << 10, f"peak RSS grew by {grown:,} KiB while refusing {path}"


def test_the_hand_written_archive_is_what_torch_save_writes(model, tmp_path):
    # The oracle for the helper: the same model, written both ways, loads the same.
    write_model_file(model, tmp_path / "saved.pt")
    structure, data, _ = take_apart(model)
    write_model(tmp_path / "written.pt", structure, data)
    saved, written = ps.load_model(tmp_path / "saved.pt"), ps.load_model(tmp_path / "written.pt")
    for (n, a), (m, b) in zip(saved.named_parameters(), written.named_parameters()):
        assert n == m and torch.equal(a, b)


@pytest.mark.parametrize("edit,match", [
    (lambda s: s["args"].update(dim=10 ** 12), r"args \{'dim': 1000000000000.* does not fit the tensors the file "
                                               r"holds .*parameter mlp.0.weight is \[5, 2000000000001\] here, "
                                               r"\[5, 7\] in m.pt; sparse table 'deep' is dim 1000000000000 here"),
    (lambda s: s["args"].update(hidden=[10 ** 13]), r"does not fit the tensors the file holds"),
    (lambda s: s["args"].update(hidden=[5] * 100000), r"args.hidden has 100000 entries"),
])
def test_hostile_spec_sizes_are_refused_before_building(model, tmp_path, edit, match):
    hostile = copy.deepcopy(model)
    edit(hostile["spec"])
    write_model_file(hostile, tmp_path / "m.pt")
    refused_cheaply(tmp_path / "m.pt", rf"m.pt: .*{match}")


def test_hostile_hashed_buckets_are_refused_before_building(hashed_model, tmp_path):
    hostile = copy.deepcopy(hashed_model)
    hostile["spec"]["embedding"]["buckets"] = 1 << 40
    write_model_file(hostile, tmp_path / "m.pt")
    refused_cheaply(tmp_path / "m.pt", r"m.pt: .*spec.*(does not fit|cannot be built).*export-model")


def test_a_tensor_larger_than_its_data_is_refused(model, tmp_path):
    structure, data, refs = take_apart(model)
    [rows] = [f for f in refs if f.endswith("/rows")][:1]
    ref = refs[rows]
    # The pickle says [10**11, 3] rows of float32 (1.2 TB): storage and shape agree, the data does not.
    hostile = TensorRef(StorageRef(ref.storage.key, ref.storage.kind, 10 ** 11 * 3), (10 ** 11, 3))
    table = rows.split("/")[2]
    structure["sparse"][table]["rows"] = hostile
    write_model(tmp_path / "m.pt", structure, data)
    refused_cheaply(tmp_path / "m.pt", rf"m.pt: refused before reading it: \['sparse'\]\['{table}'\]\['rows'\]: "
                                       r"the file's index says 1,200,000,000,000 bytes .* but that member holds \d+ bytes")


def test_a_shape_past_its_storage_is_refused(model, tmp_path):
    structure, data, refs = take_apart(model)
    field = next(f for f in refs if f.startswith("/dense/"))
    ref = refs[field]
    structure["dense"][field[len("/dense/"):]] = TensorRef(ref.storage, (10 ** 12,))
    write_model(tmp_path / "m.pt", structure, data)
    refused_cheaply(tmp_path / "m.pt", r"m.pt: refused before reading it: \['dense'\].*shape \[1000000000000\] "
                                       r"needs 4,000,000,000,000 bytes .* of its storage")


@pytest.fixture(scope="module")
def bomb_files(model, tmp_path_factory):
    """The model's first table rows as a 2 GiB DEFLATE member of zeros (~2 MB on disk): once with
    a pickle that claims 2 GiB of rows, once with headers that state only the few bytes the pickle
    declares (the stream inflates to 2 GiB all the same)."""
    root = tmp_path_factory.mktemp("bombs")
    structure, data, refs = take_apart(model)
    field = next(f for f in refs if f.endswith("/rows"))
    table, ref = field.split("/")[2], refs[field]
    name = f"model/data/{ref.storage.key}"
    honest, _, _ = take_apart(model)
    honest["sparse"][table]["rows"] = TensorRef(StorageRef(ref.storage.key, ref.storage.kind, 2 * GiB // 4),
                                                (2 * GiB // 4,))
    write_model(root / "bomb.pt", honest, data, {name: deflated_zeros(name, 2 * GiB)})
    write_model(root / "liar.pt", structure, data, {name: deflated_zeros(name, 2 * GiB, stated=len(data[ref.storage.key]))})
    assert os.path.getsize(root / "bomb.pt") < 4 << 20
    return root, name


def test_a_deflate_bomb_is_refused_from_its_central_directory(bomb_files):
    root, name = bomb_files
    refused_cheaply(root / "bomb.pt", rf"bomb.pt: refused before reading it: member {name} states it inflates to "
                                      r"2,147,483,648 bytes \(2 GiB\) from .* past the limit of 64x")


def test_a_central_directory_that_lies_is_caught_by_the_bounded_reader(bomb_files):
    root, name = bomb_files
    refused_cheaply(root / "liar.pt", rf"liar.pt: refused before reading it: member {name} inflates past the "
                                      r"\d+ bytes it states .*stopped there")


PEAK_OF_CHILD = ("import resource, subprocess, sys\n"
                 "code = subprocess.run(sys.argv[1:]).returncode\n"
                 "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
                 "sys.exit(code)\n")


def test_paramshard_predict_refuses_the_bomb_cleanly(bomb_files, tmp_path):
    root, name = bomb_files
    data = tmp_path / "new.csv"
    data.write_text("x,c,d\n1.0,a,b\n")
    environ = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    # `predict` runs under a bare interpreter that reports its one child's peak RSS: this process's
    # own RUSAGE_CHILDREN is the peak of every child it ever waited for (other tests' jobs too).
    proc = subprocess.run([sys.executable, "-c", PEAK_OF_CHILD, sys.executable, "-m", "paramshard", "predict",
                           str(root / "bomb.pt"), str(data)],
                          env=environ, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"bomb.pt: refused before reading it: member {name} states it inflates to" in proc.stderr, proc.stderr
    assert "export-model" in proc.stderr
    # The child's peak: the interpreter and torch, not 2 GiB of zeros.
    peak_kib = int(proc.stdout.rsplit("PEAK_KIB ", 1)[1])
    assert peak_kib < 1 << 20, f"predict's peak RSS was {peak_kib} KiB, over 1 GiB"


def npz_members(tmp_path) -> dict:
    """The members of a real table export, by name."""
    import zipfile
    save_table(tmp_path / "real.npz", {"name": "t", "dim": 2, "seed": 0, "init_scale": 0.01},
               np.array([1, 5], np.uint64), np.ones((2, 2), np.float32))
    with zipfile.ZipFile(tmp_path / "real.npz") as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def refused_table(path, match):
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=match):
            load_table(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak:,} bytes traced while refusing {path}"


def test_a_table_export_whose_header_claims_more_rows_than_it_holds_is_refused(tmp_path):
    members = npz_members(tmp_path)
    assert load_table(tmp_path / "real.npz").values.shape == (2, 2)         # the oracle: the real one loads
    members["values.npy"] = npy_header("<f4", (10 ** 11, 2)) + np.ones((2, 2), np.float32).tobytes()
    write_zip(tmp_path / "t.npz", [stored(n, data) for n, data in members.items()])
    refused_table(tmp_path / "t.npz", r"t.npz: refused before reading it: 'values': its header says float32 "
                                      r"\[100000000000, 2\] .* but that member holds 144 bytes")


def test_a_table_export_bomb_is_refused(tmp_path):
    members = npz_members(tmp_path)
    rest = [stored(n, data) for n, data in members.items() if n != "values.npy"]
    header = npy_header("<f4", (2 * GiB // 8, 2))
    write_zip(tmp_path / "bomb.npz", rest + [deflated_zeros("values.npy", 2 * GiB, prefix=header)])
    refused_table(tmp_path / "bomb.npz", r"bomb.npz: refused before reading it: member values.npy states it "
                                         r"inflates to 2,147,483,\d+ bytes .* past the limit of 64x")
    # Header and directory agree on 2 rows (16 bytes); the stream goes on for 2 GiB.
    header = npy_header("<f4", (2, 2))
    write_zip(tmp_path / "liar.npz", rest + [deflated_zeros("values.npy", 2 * GiB, prefix=header,
                                                            stated=len(header) + 16)])
    refused_table(tmp_path / "liar.npz", r"liar.npz: refused before reading it: member values.npy inflates past "
                                         r"the \d+ bytes it states .*stopped there")
