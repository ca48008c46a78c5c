"""data/features/names.py: "did you mean" for column names."""
from paramshard.data.features.names import close_names, did_you_mean


def test_near_names_are_suggested_best_first_and_case_is_folded():
    known = ["user_id", "movie_id", "zip_code", "label"]
    assert did_you_mean("moive_id", known) == " (did you mean 'movie_id'?)"
    assert close_names("UserID", known)[0] == "user_id"
    assert did_you_mean("lable", known) == " (did you mean 'label'?)"
    assert set(close_names("x_id", ["a_id", "b_id"])) == {"a_id", "b_id"}      # ties: both


def test_nothing_near_gives_nothing():
    assert did_you_mean("timestamp", ["user_id", "label"]) == ""
    assert did_you_mean("a", []) == ""
