"""Bounded-loss recovery with real servers: kill -9 one of two async servers mid-run; the
launcher's replica keeper restores it and the trainers go on without a rollback
(tests/integration/bounded_loss_harness.py has the exact-sum oracle)."""
import pytest

from tests.integration.bounded_loss_harness import run


@pytest.mark.timeout(90)
def test_killed_server_serves_again_within_10s_losing_at_most_1s_of_pushes(cluster):
    out = run(cluster)
    print(f"\nserver 1 serving again {out.serving_again_s:.2f} s after kill -9; keeper: {out.restored['text'] if 'text' in out.restored else out.restored['recovery_s']} s; "
          f"lost {out.lost_pushes} pushes (estimated {out.restored['updates_lost_estimate']}); "
          f"{out.answered_last_second} answered in the last second before the kill; {out.steps}+ steps a trainer")
    assert out.serving_again_s < 10
    assert out.lost_pushes <= out.answered_last_second
    assert out.steps > 0
