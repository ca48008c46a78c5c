"""scikit-learn's baselines of benchmarks/public_tables.py, on the columns as a paramshard schema sees them.

A column's kind comes from the fitted schema (what ``paramshard schema infer`` guessed):
numeric columns are numbers (missing: the training median), categorical columns text
(missing: its own value), a multi-valued column one 0/1 column per value seen in
training, dropped columns nothing. Labels are the schema's (its positive values, or
numbers > 0), so every candidate is scored on the same 0/1 labels.

- LogisticRegression: one-hot categories (unknown values ignored), standardized numbers
  and indicators, scikit-learn's default C, lbfgs with max_iter 5000 (enough to
  converge on all three datasets; a run that does not says so in its row);
- HistGradientBoostingClassifier: scikit-learn's defaults (early stopping on 10% of the
  rows when there are more than 10,000); categories with at most 255 values in training
  as native categories, more as ordinal codes (native categories allow at most max_bins).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

MAX_ITER = 5000
NATIVE_CATEGORIES = 255


def read(path, schema):
    """(features frame, 0/1 labels, column kinds) of a CSV as the schema describes it."""
    import pandas as pd
    kinds = {c.name: c.kind for c in schema.columns if c.kind != "drop" and c.name != schema.label.column}
    text = {n: str for n, k in kinds.items() if k != "numeric"}
    df = pd.read_csv(path, dtype={**text, schema.label.column: str}, keep_default_na=False,
                     na_values=list(schema.format.missing))
    raw = df[schema.label.column]
    if schema.label.positive:
        y = raw.isin([str(v) for v in schema.label.positive]).to_numpy().astype(int)
    else:
        y = (raw.astype(float) > 0).to_numpy().astype(int)
    return df[list(kinds)], y, kinds


def multi_hot(train, test, kinds: dict, separators: dict):
    """Each multi-valued column as one 0/1 column per value the training rows hold."""
    train, test = train.copy(), test.copy()
    for name, kind in kinds.items():
        if kind != "multi":
            continue
        values = sorted({v for cell in train[name].dropna() for v in cell.split(separators[name]) if v})
        for frame in (train, test):
            cells = frame[name].fillna("").map(lambda c: set(c.split(separators[name])))
            for v in values:
                frame[f"{name}={v}"] = cells.map(lambda s: float(v in s))
            frame.drop(columns=name, inplace=True)
    return train, test


def logistic_regression(train, y, test, categories, numbers):
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    prep = ColumnTransformer([("categories", OneHotEncoder(handle_unknown="ignore"), categories),
                              ("numbers", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numbers)])
    model = make_pipeline(prep, LogisticRegression(max_iter=MAX_ITER))
    model.fit(train.fillna({c: "(missing)" for c in categories}), y)
    converged = bool(model[-1].n_iter_.max() < MAX_ITER)
    return model.predict_proba(test.fillna({c: "(missing)" for c in categories}))[:, 1], converged


def gradient_boosting(train, y, test, categories, numbers):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.preprocessing import OrdinalEncoder
    train, test = train.copy(), test.copy()
    native = []
    if categories:
        codes = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan,
                               encoded_missing_value=np.nan).fit(train[categories])
        train[categories], test[categories] = codes.transform(train[categories]), codes.transform(test[categories])
        native = [c for c, values in zip(categories, codes.categories_) if len(values) <= NATIVE_CATEGORIES]
    columns = categories + numbers
    model = HistGradientBoostingClassifier(categorical_features=[c in native for c in columns], random_state=0)
    model.fit(train[columns], y)
    return model.predict_proba(test[columns])[:, 1]


def fit_and_score(train_path, test_path, schema_path) -> dict:
    """{"LogisticRegression": {...}, "HistGradientBoosting": {...}}: test auc, logloss, wall_s each
    (wall: reading both files, preparing, fitting and predicting)."""
    from paramshard.data.metrics import auc, logloss
    from paramshard.specs.schema import Schema
    schema = Schema.load(schema_path)
    separators = {c.name: c.separator for c in schema.columns}
    out = {}
    for name in ("LogisticRegression", "HistGradientBoosting"):
        start = time.perf_counter()
        train, y, kinds = read(train_path, schema)
        test, y_test, _ = read(test_path, schema)
        train, test = multi_hot(train, test, kinds, separators)
        categories = [n for n, k in kinds.items() if k == "categorical"]
        numbers = [c for c in train.columns if c not in categories]
        row = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # convergence is reported in the row instead
            if name == "LogisticRegression":
                probs, row["converged"] = logistic_regression(train, y, test, categories, numbers)
            else:
                probs = gradient_boosting(train, y, test, categories, numbers)
        probs = np.clip(probs, 1e-7, 1 - 1e-7)
        out[name] = {**row, "auc": auc(y_test, probs), "logloss": logloss(y_test, probs),
                     "wall_s": time.perf_counter() - start}
    return out
