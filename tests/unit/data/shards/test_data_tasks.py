"""data/shards/tasks.py and data/readers/ranges.py: for random files and split sizes the union of
every task's records is exactly the file's records, each once (oracle: the file read
whole), and a task's remainder from any reported position reads exactly the rest."""
import gzip
import random

import pytest
from hypothesis import given, settings, strategies as st

from paramshard.data.readers.ranges import line_groups
from paramshard.data.shards.tasks import Task, byte_spans, fingerprint, split_files
from paramshard.errors import ConfigError

line_text = st.text(alphabet="ab,\t\r", max_size=12).map(lambda s: s.replace("\r", "") or "x")


def records_of(path, tasks, lines_per_group=3, chunk_bytes=7):
    out = []
    for task in tasks:
        for chunk, _, _ in line_groups(path, task, lines_per_group, chunk_bytes=chunk_bytes):
            out += chunk.split(b"\n")[:-1]
    return out


def whole(data: bytes, header=False):
    lines = data.replace(b"\r\n", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines[1:] if header else lines


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(line_text, max_size=30), crlf=st.booleans(), final_newline=st.booleans(),
       header=st.booleans(), task_bytes=st.integers(1, 40), group=st.integers(1, 5), chunk=st.integers(1, 16))
def test_every_record_belongs_to_exactly_one_task(tmp_path_factory, lines, crlf, final_newline, header,
                                                  task_bytes, group, chunk):
    path = tmp_path_factory.mktemp("t") / "d.csv"
    nl = "\r\n" if crlf else "\n"
    text = nl.join(lines) + (nl if final_newline and lines else "")
    path.write_bytes(text.encode())
    tasks = split_files([path], task_bytes, header=header)
    assert all(t.kind == "bytes" and t.start < t.end for t in tasks)
    assert records_of(path, tasks, group, chunk) == whole(text.encode(), header)


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(line_text, min_size=1, max_size=25), task_bytes=st.integers(1, 30),
       group=st.integers(1, 4), cut=st.integers(0, 1000))
def test_a_remainder_from_a_reported_position_reads_exactly_the_rest(tmp_path_factory, lines, task_bytes,
                                                                     group, cut):
    path = tmp_path_factory.mktemp("t") / "d.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    for task in split_files([path], task_bytes):
        groups = list(line_groups(path, task, group, chunk_bytes=5))
        everything = [r for g, _, _ in groups for r in g.split(b"\n")[:-1]]
        if not groups:
            continue
        stop = cut % len(groups)
        read = [r for g, _, _ in groups[:stop + 1] for r in g.split(b"\n")[:-1]]
        rest = task.rest(groups[stop][2])
        again = [r for g, _, _ in line_groups(path, rest, group) for r in g.split(b"\n")[:-1]]
        assert read + again == everything


def test_gzip_is_one_task_and_its_remainder_counts_records(tmp_path):
    path = tmp_path / "d.txt.gz"
    lines = [f"r{i}".encode() for i in range(23)]
    with gzip.open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    [task] = split_files([path], 10)
    assert (task.kind, task.start, task.end) == ("gzip", 0, -1)
    groups = list(line_groups(path, task, 5, chunk_bytes=8))
    assert [g[2] for g in groups] == [5, 10, 15, 20, 23]
    rest = [r for g, _, _ in line_groups(path, task.rest(10), 5) for r in g.split(b"\n")[:-1]]
    assert rest == lines[10:]


def test_parquet_tasks_are_row_group_ranges(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "d.parquet"
    pd.DataFrame({"a": range(1000)}).to_parquet(path, row_group_size=100)
    tasks = split_files([path], 1)
    assert [(t.start, t.end, t.kind) for t in tasks] == [(i, i + 100, "rows") for i in range(0, 1000, 100)]
    assert split_files([path], 1 << 30)[0].end == 1000


def test_several_files_wire_form_and_bad_sizes(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"1\n2\n3\n")
    b.write_bytes(b"")
    tasks = split_files([a, b], 4)
    assert [(t.id, t.file, t.start, t.end) for t in tasks] == [(0, 0, 0, 4), (1, 0, 4, 6)]
    assert Task.from_wire(1, tasks[1].to_wire()) == tasks[1]
    assert fingerprint(["a"], tasks) != fingerprint(["b"], tasks)
    assert byte_spans(10, 3, 4) == [(3, 7), (7, 10)]
    with pytest.raises(ConfigError, match="task_bytes"):
        split_files([a], 0)


def test_a_line_far_past_its_range_end_is_read_once(tmp_path):
    path = tmp_path / "d.txt"
    rng = random.Random(3)
    lines = [("y" * rng.choice([0, 1, 50])).encode() for _ in range(40)]
    path.write_bytes(b"\n".join(lines))     # no final newline
    assert records_of(path, split_files([path], 3)) == [line for line in lines]


def test_the_largest_task_list_fits_one_wire_header(tmp_path):
    """MAX_TASKS tasks with offsets near 2**40 and a few long names: shard_register's header
    stays under protocol.MAX_HEADER_BYTES, so a list the splitter allows is never refused
    on the wire."""
    from paramshard.data.shards.tasks import MAX_TASKS
    from paramshard.transport import protocol
    tasks = [Task(i, 0, (1 << 40) + i, (1 << 40) + i + 1, "bytes") for i in range(MAX_TASKS)]
    header = {"op": "shard_register", "trainer": 0, "pass": 1, "fingerprint": "f" * 32, "step": 0,
              "session": "s" * 16, "files": ["x" * 1000] * 10, "tasks": [t.to_wire() for t in tasks]}
    assert len(protocol.encode(header)[0]) < protocol.MAX_HEADER_BYTES
