"""data/features/id_columns.py: which columns hold ids, by name and by values, and the doubt a note carries."""
import numpy as np
import pytest

from paramshard.data.features.id_columns import (MIN_DISTINCT, ambiguity, id_name, id_values, name_words, with_doubt,
                                        without_doubt)
from paramshard.specs.schema import Column


@pytest.mark.parametrize("name,words", [("user_id", ["user", "id"]), ("movieId", ["movie", "id"]),
                                        ("userID", ["user", "id"]), ("Zip-Code", ["zip", "code"]),
                                        ("C14", ["c", "14"]), ("hours_per_week", ["hours", "per", "week"])])
def test_names_split_into_words_at_separators_case_changes_and_digits(name, words):
    assert name_words(name) == words


@pytest.mark.parametrize("name", ["id", "ID", "Id", "user_id", "movieId", "userID", "item_ids", "zip_code",
                                  "zip", "ZIP", "zipcode", "countrycode", "postcode", "postal", "country_code",
                                  "areaCode", "session_uuid", "ad_key", "userid", "movieid", "uid", "zip5",
                                  "product_sku"])
def test_id_names(name):
    assert id_name(name)


@pytest.mark.parametrize("name", ["paid", "valid", "width", "idle", "idle_time", "is_valid", "id_count", "grid",
                                  "android", "humidity", "rating", "hours_per_week", "age", "code_lines",
                                  "keys_pressed", "encode", "unicode", "amount_paid", "squid", "encoded", "C14",
                                  "label", ""])
def test_not_id_names(name):
    assert id_name(name) is None


def test_an_id_name_says_which_word_decided():
    assert "'id'" in id_name("user_id") and "'code'" in id_name("zip_code")
    assert "'movie' + 'id'" in id_name("movieid")


def zipf_ids(n, k, seed=0):
    """Interaction-log ids: 1..k handed out in sequence, popularity Zipf-like and unrelated to the number."""
    rng = np.random.default_rng(seed)
    popularity = 1 / np.arange(1, k + 1) ** 0.8
    ids = rng.permutation(k) + 1
    return ids[rng.choice(k, n, p=popularity / popularity.sum())].astype(float)


def test_sequential_ids_in_an_interaction_log_are_ids_by_their_values():
    verdict, why = id_values(zipf_ids(20000, 3000))
    assert verdict == "ids" and "distinct whole numbers" in why
    assert id_values(np.random.default_rng(1).integers(1, 944, 20000).astype(float))[0] == "ids"   # users


@pytest.mark.parametrize("values,verdict,reason", [
    # a float measurement
    (np.random.default_rng(0).normal(10, 2, 5000), "no", "not all whole numbers"),
    # a signed quantity
    (np.random.default_rng(0).integers(-500, 500, 5000).astype(float), "no", "negative"),
    # small-cardinality integers: a rating, hours per week (99 values, dense), an age
    (np.random.default_rng(0).integers(1, 6, 5000).astype(float), "no", "under"),
    (np.random.default_rng(0).integers(1, 100, 5000).astype(float), "no", "under"),
    # a census sample weight: whole numbers, thousands distinct, spread thin over a wide range (but
    # evenly enough that ids from a large space would look the same: "maybe")
    (np.round(np.random.default_rng(0).lognormal(12, 0.3, 20000)), "maybe", "spread thin"),
    # a unix timestamp: the same
    (np.random.default_rng(0).integers(874_000_000, 893_000_000, 20000).astype(float), "maybe", "spread thin"),
    # money: spread thin and heavy-tailed, plainly an amount
    (np.round(np.random.default_rng(0).lognormal(5, 2, 20000)), "no", "spread thin"),
    # a score bunched around a typical value (dense over 300..850, but a bell curve)
    (np.clip(np.round(np.random.default_rng(0).normal(650, 70, 20000)), 300, 850), "no", "bunched"),
    # a count piling up at the low end (dense range, heavy tail)
    (np.floor(np.random.default_rng(0).exponential(60, 20000)), "no", "bunched"),
])
def test_quantities_are_not_ids(values, verdict, reason):
    got, why = id_values(values)
    assert got == verdict and reason in why


def test_the_distinct_count_threshold_is_exact():
    dense = np.arange(MIN_DISTINCT, dtype=float)
    assert id_values(np.tile(dense, 3))[0] == "ids"
    assert id_values(np.tile(dense[:-1], 3))[0] == "no"


def test_a_doubt_is_the_last_clause_of_the_note_and_reads_back():
    note = with_doubt("numbers; skewness 0.1", "whole numbers with 500 distinct values kept numeric")
    assert ambiguity(Column("x", note=note)) == "whole numbers with 500 distinct values kept numeric"
    assert without_doubt(note) == "numbers; skewness 0.1"
    assert with_doubt("text", "") == "text" and ambiguity(Column("x", "categorical", note="text")) == ""


def test_a_numeric_column_named_like_an_id_is_doubtful_even_without_a_note():
    """A hand-edited schema: the name alone is enough to point at it."""
    assert "'id'" in ambiguity(Column("user_id", "numeric", transforms=["standardize"]))
    assert ambiguity(Column("user_id", "categorical")) == ""
    assert ambiguity(Column("paid", "numeric", transforms=["standardize"])) == ""
