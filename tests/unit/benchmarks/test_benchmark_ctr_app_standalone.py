"""benchmarks/ctr_app_standalone.py's pure parts: what each candidate runs and sees (no processes)."""
from tests.unit.benchmark_scripts import import_script

B = import_script("ctr_app_standalone")


def test_no_candidate_inherits_a_thread_count_or_a_cluster(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    monkeypatch.setenv("PARAMSHARD_ROLE", "trainer")
    env = B.run_environ("/tree/src")
    assert env["PYTHONPATH"] == "/tree/src"
    assert not {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "PARAMSHARD_ROLE"} & set(env)


def test_the_candidates_and_their_trainers():
    assert {name: (t, launch) for name, (t, _, launch) in B.candidates(None).items()} == {
        "standalone": (1, None),
        "launch 1+1": (1, ["--servers", "1", "--trainers", "1", "--timeout", "120"]),
        "launch 2+2": (2, ["--servers", "2", "--trainers", "2", "--timeout", "120"])}
    assert B.candidates("/old/src")["standalone (--before)"] == (1, "/old/src", None)
