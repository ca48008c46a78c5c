"""The restart policy (launch/supervision/restart_policy.py): in-place and whole-job restarts under one
budget, decided without processes, as the launcher decided them before it was a policy."""
from pathlib import Path

from paramshard.launch.supervision.restart_policy import Choice, RestartPolicy

CKPT = Path("/ckpt/step-00000005")


def latest():
    return CKPT


def none():
    return None


def asked_never():
    raise AssertionError("the checkpoints are looked for only when a restart is due")


def test_a_dead_server_with_budget_and_a_checkpoint_restarts_in_place_for_one():
    d = RestartPolicy(2).in_place(failed=1, only_servers=True, hung=0, cost=1, latest=latest)
    assert d.restart and d.checkpoint == CKPT and d.cost == 1


def test_nothing_failed_nothing_hangs_no_restart():
    assert RestartPolicy(2).in_place(0, True, 0, 0, asked_never).choice is Choice.FAIL


def test_a_failed_trainer_is_never_restarted_in_place():
    assert RestartPolicy(2).in_place(2, False, 0, 1, asked_never).choice is Choice.FAIL


def test_an_incident_costing_more_than_is_left_fails():
    policy = RestartPolicy(2, used=1)
    assert policy.in_place(2, True, 0, 2, asked_never).choice is Choice.FAIL
    assert policy.in_place(1, True, 0, 1, latest).restart


def test_a_casualty_of_a_just_restarted_peer_comes_back_free_even_without_budget():
    d = RestartPolicy(1, used=1).in_place(1, True, 0, 0, latest)
    assert d.restart and d.cost == 0


def test_no_checkpoint_a_dead_server_is_said_a_hung_one_alone_is_left_to_the_timeout():
    assert RestartPolicy(1).in_place(1, True, 0, 1, none).choice is Choice.NO_CHECKPOINT
    assert RestartPolicy(1).in_place(0, True, 1, 1, none).choice is Choice.FAIL


def test_a_hung_server_alone_restarts_in_place():
    d = RestartPolicy(1).in_place(0, True, 1, 1, latest)
    assert d.restart and d.cost == 1


def test_spending_draws_on_the_one_budget():
    policy = RestartPolicy(3)
    policy.spend(policy.in_place(1, True, 1, 2, latest))
    assert (policy.used, policy.left) == (2, 1)
    policy.spend(policy.whole_job(1, False, latest))
    assert (policy.used, policy.left) == (3, 0)
    assert policy.whole_job(1, False, asked_never).choice is Choice.FAIL
    policy.spend(policy.whole_job(1, False, asked_never))     # a FAIL spends nothing
    assert policy.used == 3


def test_the_whole_job_runs_again_after_a_failure_with_budget_and_a_checkpoint():
    d = RestartPolicy(1).whole_job(1, False, latest)
    assert d.restart and d.checkpoint == CKPT and d.cost == 1


def test_a_job_that_succeeded_or_was_stopped_by_a_signal_is_never_run_again():
    assert RestartPolicy(5).whole_job(0, False, asked_never).choice is Choice.FAIL
    assert RestartPolicy(5).whole_job(130, True, asked_never).choice is Choice.FAIL


def test_the_whole_job_without_a_checkpoint_says_so():
    assert RestartPolicy(1).whole_job(1, False, none).choice is Choice.NO_CHECKPOINT


def test_in_place_restarts_leave_that_much_less_for_the_whole_job():
    policy = RestartPolicy(1)
    policy.spend(policy.in_place(1, True, 0, 1, latest))
    assert policy.whole_job(1, False, asked_never).choice is Choice.FAIL


def test_elastic_a_dead_trainer_is_replaced_while_budget_lasts_one_restart_each():
    policy = RestartPolicy(2)
    for _ in range(2):
        d = policy.dead_trainer(alive=1, minimum=2)
        assert d.choice is Choice.REPLACE and d.cost == 1
        policy.spend(d)
    assert policy.left == 0


def test_elastic_without_budget_the_job_goes_on_while_min_trainers_are_alive():
    policy = RestartPolicy(0)
    assert policy.dead_trainer(alive=2, minimum=2).choice is Choice.CONTINUE
    assert policy.dead_trainer(alive=1, minimum=2).choice is Choice.FAIL
    policy.spend(policy.dead_trainer(alive=2, minimum=2))
    assert policy.used == 0           # going on with fewer costs nothing
