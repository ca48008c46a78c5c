# The two entry points of the README: `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test venv bench clean

venv: $(STAMP)

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[examples,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/paramshard launch --servers 2 --trainers 2 examples/ctr_wide_deep.py

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/dense_push_pull.py

clean:
	rm -rf $(VENV) build src/*.egg-info
