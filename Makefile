# The two entry points of the README: `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test check typecheck venv warm bench clean

venv: $(STAMP)

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[examples,test]"
	touch $(STAMP)

# The row store's kernels compile once into numba's cache (seconds; milliseconds when cached), so
# no server compiles them while trainers wait on its first pull.
warm: $(STAMP)
	$(PY) -m paramshard.server.storage.kernels.warm

demo: warm
	$(VENV)/bin/paramshard launch --servers 2 --trainers 2 --report examples/ctr_wide_deep.py

# The engine tests need sshd, rsync, iproute2, OpenMPI, Slurm and munge (Debian packages, installed as root;
# elsewhere those tests skip and say why).
test: warm typecheck
	bash scripts/install-test-engines.sh || echo "make: engine install failed; the engine tests (SSH, MPI, Slurm) will skip" >&2
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The contracts (RowStore, TrainerBackend, Service, RequestHook, Process, Engine) checked against
# their implementations, and the rest of src/paramshard as pyproject.toml [tool.mypy] says; offline,
# cached in .mypy_cache (seconds when warm).
typecheck: $(STAMP)
	$(PY) -m mypy

# The quick stage: every test that neither kills a process nor needs an engine (no e2e, nothing
# marked `processes`), servers as threads of the test process (tests/conftest.py Cluster).
check: warm typecheck
	PARAMSHARD_TEST_SERVERS=threads PARAMSHARD_UNIT_LIMIT_STRICT=1 $(PY) -m pytest -q -m "not processes and not fuzz and not matrix" tests/unit tests/integration

# Every peer runs under the malloc settings the launcher gives paramshard's processes.
TUNABLES := glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483648
bench: warm
	GLIBC_TUNABLES=$(TUNABLES) $(PY) benchmarks/dense_push_pull.py --markdown
	$(PY) benchmarks/sparse_rows.py --markdown
	$(PY) benchmarks/ctr_end_to_end.py --markdown
	$(PY) benchmarks/ps_vs_pytorch.py --markdown
	$(PY) benchmarks/sparse_memory.py --markdown
	$(PY) benchmarks/big_table.py --markdown
	$(PY) benchmarks/row_store.py --quick --markdown
	$(PY) benchmarks/checkpoint_speed.py --markdown
	$(PY) benchmarks/engine_startup.py --markdown
	$(PY) benchmarks/tabular_reader.py --markdown
	$(PY) benchmarks/ctr_app_standalone.py --markdown
	$(PY) benchmarks/modes.py --markdown
	$(PY) benchmarks/public_tables.py --markdown

clean:
	rm -rf $(VENV) build src/*.egg-info
