"""`paramshard gen-data` and `paramshard split-data` as a user types them."""
import re
import subprocess
import sys

from tests.e2e.in_process import cli_in_process


def ps(*args, cwd):
    return subprocess.run([sys.executable, "-m", "paramshard", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_gen_then_split(tmp_path):
    gen = ps("gen-data", "train.txt", "--rows", 1000, "--seed", 4, cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    auc = float(re.search(r"hidden-model AUC (\d\.\d+)", gen.stdout).group(1))
    assert 0.7 < auc < 0.9
    lines = (tmp_path / "train.txt").read_bytes().splitlines(keepends=True)
    assert len(lines) == 1000 and all(line.count(b"\t") == 39 for line in lines)
    again = ps("gen-data", "again.txt", "--rows", 1000, "--seed", 4, cwd=tmp_path)
    assert (tmp_path / "again.txt").read_bytes() == (tmp_path / "train.txt").read_bytes()
    assert again.stdout.splitlines()[1:] == gen.stdout.splitlines()[1:]

    split = ps("split-data", "train.txt", "--shards", 3, "--out", "parts", cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    assert "1000 lines in 3 parts" in split.stdout
    assert re.search(r"part-00000\s+334 lines", split.stdout)
    for k in range(3):
        assert (tmp_path / "parts" / f"part-{k:05d}").read_bytes().splitlines(keepends=True) == lines[k::3]


def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, monkeypatch):
    """The checks, run by this process's own ``main`` (the next test runs the real command)."""
    monkeypatch.chdir(tmp_path)

    def ps(*args, cwd):
        code, out, err = cli_in_process(capsys, *args)
        return subprocess.CompletedProcess(args, code, out, err)

    (tmp_path / "in.txt").write_text("a\nb\n")
    cases = [
        (["split-data", "missing.txt", "--shards", 2, "--out", "o"], "paramshard split-data: error: missing.txt: no such file"),
        (["split-data", "in.txt", "--shards", 0, "--out", "o"], "paramshard split-data: error: --shards must be >= 1, got 0"),
        (["gen-data", "x.txt", "--rows", -5], "paramshard gen-data: error: --rows must be >= 0, got -5"),
        (["gen-data", "in.txt/x.txt", "--rows", 5],
         "paramshard gen-data: error: in.txt/x.txt: cannot create directory in.txt: a file is in the way"),
        (["split-data", ".", "--shards", 2, "--out", "o"], "paramshard split-data: error: .: is a directory"),
    ]
    for args, message in cases:
        got = ps(*args, cwd=tmp_path)
        assert got.returncode == 2, (args, got.stderr)
        assert message in got.stderr and "Traceback" not in got.stderr
    assert ps("split-data", "in.txt", "--shards", 1, "--out", "o", cwd=tmp_path).returncode == 0
    again = ps("split-data", "in.txt", "--shards", 1, "--out", "o", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr


def test_bad_input_reaches_the_user_of_the_command(tmp_path):
    got = ps("split-data", "missing.txt", "--shards", 2, "--out", "o", cwd=tmp_path)
    assert got.returncode == 2, got.stderr
    assert "paramshard split-data: error: missing.txt: no such file" in got.stderr and "Traceback" not in got.stderr
