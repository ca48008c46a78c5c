"""Whole-file trouble, on every path that reads input files (both readers and
split-data): broken .gz files, empty files, and lines too long to hold."""
import gzip
import logging
import tracemalloc

import pytest

from paramshard.cli.main import main as cli_main
from paramshard.data import CriteoReader, DataFormatError, LibsvmReader, split_lines
from paramshard.data.readers import _reader
from paramshard.errors import ConfigError

CRITEO_LINE = "\t".join(["1", *map(str, range(13)), *[f"{i:08x}" for i in range(26)]])
LIBSVM_LINE = "1 3:0.5 10:1"


def read_criteo(path, tmp_path, **kw):
    return list(CriteoReader(path, 100, **kw))


def read_libsvm(path, tmp_path, **kw):
    return list(LibsvmReader(path, 100, **kw))


def split_by_lines(path, tmp_path, **kw):
    return split_lines(path, 2, tmp_path / "out", **kw)


def split_by_files(path, tmp_path, **kw):
    return split_lines(path, 1, tmp_path / "out", by="files", **kw)


# every way the package reads a file, with a line it reads without complaint
READS = {"criteo": (read_criteo, CRITEO_LINE), "libsvm": (read_libsvm, LIBSVM_LINE),
         "split-lines": (split_by_lines, CRITEO_LINE), "split-files": (split_by_files, CRITEO_LINE)}


@pytest.fixture(params=list(READS))
def read(request):
    return READS[request.param]


def gz_bytes(line, n=20000):
    return gzip.compress(("\n".join([line] * n) + "\n").encode(), mtime=0)


def no_temp_parts_left(tmp_path):
    return not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.tmp"))


def test_truncated_gz_names_the_file_and_what_to_do(tmp_path, read):
    fn, line = read
    whole = gz_bytes(line)
    path = tmp_path / "day_0.gz"
    path.write_bytes(whole[:len(whole) // 2])  # a download cut short
    with pytest.raises(DataFormatError) as err:
        fn(path, tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "not a complete gzip file" in msg
    assert "re-fetch" in msg and "gunzip -t" in msg
    assert not isinstance(err.value, EOFError) and no_temp_parts_left(tmp_path)


def test_plain_text_named_gz_says_so(tmp_path, read):
    fn, line = read
    path = tmp_path / "train.txt.gz"
    path.write_text(line + "\n")
    with pytest.raises(DataFormatError) as err:
        fn(path, tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "not gzip data" in msg and "rename" in msg
    assert not isinstance(err.value, gzip.BadGzipFile) and no_temp_parts_left(tmp_path)


@pytest.mark.parametrize("damage", ["deflate", "crc"])
def test_corrupt_gz_names_the_file(tmp_path, read, damage):
    fn, line = read
    data = bytearray(gz_bytes(line))
    if damage == "deflate":
        data[20:28] = b"\xff" * 8  # zlib.error: invalid compressed data
    else:
        data[-8] ^= 1  # BadGzipFile: CRC check failed
    path = tmp_path / "d.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(DataFormatError) as err:
        fn(path, tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "corrupt gzip file" in msg and "re-fetch" in msg
    assert no_temp_parts_left(tmp_path)


def test_split_data_cli_reports_a_broken_gz_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "in.gz"
    path.write_text("a\nb\n")
    assert cli_main(["split-data", str(path), "--shards", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"paramshard split-data: error: {path}: " in err and "not gzip data" in err


@pytest.fixture
def data_log():
    """Warnings of the data package. A handler of our own, because
    paramshard.log.configure() (run by other tests) stops propagation to caplog's."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("paramshard.data")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.mark.parametrize("kind", ["plain", "0-byte gz", "gz of nothing"])
def test_empty_input_file_is_warned_about_by_name(tmp_path, read, data_log, kind):
    fn, line = read
    empty = tmp_path / ("empty.txt" if kind == "plain" else "empty.gz")
    empty.write_bytes(gzip.compress(b"") if kind == "gz of nothing" else b"")
    full = tmp_path / "full.txt"
    full.write_text(line + "\n")
    fn([full, empty], tmp_path)
    messages = [r.getMessage() for r in data_log if r.levelno == logging.WARNING]
    assert len(messages) == 1 and messages[0].startswith(f"{empty}: ")
    assert ("0 bytes" if kind != "gz of nothing" else "no lines after decompression") in messages[0]


def test_non_empty_files_are_not_warned_about(tmp_path, read, data_log):
    fn, line = read
    path = tmp_path / "d.gz"
    path.write_bytes(gz_bytes(line, 3))
    fn(path, tmp_path)
    assert data_log == []


def huge_line_file(path, line, size=20 << 20):
    """Two good lines, then ``size`` bytes of tabs and no newline."""
    head = (line + "\n") * 2
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(head.encode())
        for _ in range(size >> 20):
            f.write(b"\t" * (1 << 20))
    return path


@pytest.mark.parametrize("kind", ["criteo", "libsvm", "split-lines"])  # split-files holds no line
@pytest.mark.parametrize("name", ["long.txt", "long.gz"])  # the .gz: 20 KB that inflate to 20 MB
def test_a_huge_line_fails_fast_in_bounded_memory(tmp_path, kind, name):
    fn, line = READS[kind]
    path = huge_line_file(tmp_path / name, line)
    tracemalloc.start()
    try:
        with pytest.raises(DataFormatError) as err:
            fn(path, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith(f"{path}:3: line is longer than {_reader.MAX_LINE_BYTES} bytes")
    assert "max_line_bytes" in str(err.value)
    assert peak < 6 * _reader.MAX_LINE_BYTES  # ~ limit + a chunk, far below the 20 MB of the line
    assert no_temp_parts_left(tmp_path)


@pytest.mark.parametrize("chunk", [1, 7, 100, 101, 102, 1 << 20])
def test_line_limit_is_exact_whatever_the_chunk_size(tmp_path, chunk):
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"ab\n" * 50 + b"x" * 100 + b"\n" + b"ab\n" * 50)
    assert sum(c.count(b"\n") for _, c in _reader.iter_chunks(ok, chunk, max_line_bytes=100)) == 101
    for tail in (b"\n", b"\r\n", b""):  # the line end is not counted; a missing one is no help
        bad = tmp_path / "bad.txt"
        bad.write_bytes(b"ab\n" * 50 + b"x" * 101 + tail + b"ab\n" * (50 if tail else 0))
        with pytest.raises(DataFormatError, match=rf"^{bad}:51: line is longer than 100 bytes"):
            list(_reader.iter_chunks(bad, chunk, max_line_bytes=100))


def test_max_line_bytes_is_a_reader_and_split_argument(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text(CRITEO_LINE + "\n")
    size = len(CRITEO_LINE)
    assert len(read_criteo(path, tmp_path, max_line_bytes=size)[0]) == 1
    for fn in (read_criteo, read_libsvm, split_by_lines):
        with pytest.raises(DataFormatError, match=rf"^{path}:1: line is longer than {size - 1} bytes"):
            fn(path, tmp_path, max_line_bytes=size - 1)
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=f"max_line_bytes={bad}: must be >= 1"):
            CriteoReader(path, 10, max_line_bytes=bad)
        with pytest.raises(ConfigError, match=f"max_line_bytes={bad}: must be >= 1"):
            split_lines([path], 1, tmp_path / "o", max_line_bytes=bad)
