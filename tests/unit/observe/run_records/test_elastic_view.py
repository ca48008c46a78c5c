"""observe/run_records/elastic_view.py and the report's elastic section: membership over time, moves
with the longest trainer step during each, recoveries, from records written here by hand."""
from __future__ import annotations

import json

from paramshard.observe.run_records import elastic_view as ev
from paramshard.observe.report.html import render_index
from paramshard.observe.report.membership_plot import plot_membership
from paramshard.observe.run_records.records import write_json
from paramshard.observe.run_records.run_data import load_run
from paramshard.observe.run_records.trainer_records import TrainerRecords

T0 = 1_790_000_000.0


def _event(t, event, **fields):
    return {"t": T0 + t, "kind": "event", "event": event, "text": f"{event} at {t}", **fields}


def _trainer(t, trainer, step, longest):
    return {"t": T0 + t, "kind": "trainer", "trainer": trainer, "step": step, "samples": step * 10,
            "samples_per_s": 100.0, "step_max_s": longest}


def elastic_run(root):
    records = [_event(0, "start"),
               _trainer(1, 0, 10, 0.1), _trainer(1, 1, 10, 0.1),
               _event(2, "membership", role="trainer", rank="trainer 2", change="joined", live=3),
               _trainer(5, 0, 40, 0.2), _trainer(5, 1, 40, 0.9),
               # a move of 3 s ending at t=9 (from 6 to 9); trainer 1's slow step 7.5..8.0 overlaps it
               _trainer(8, 1, 60, 0.5), _trainer(9.5, 0, 70, 0.05),
               _event(9, "scale_end", servers_before=2, servers_after=3, partitions=86, rows=1000, bytes=64000,
                      seconds=3.0),
               _event(11, "membership", role="trainer", rank="trainer 1", change="lost", live=2),
               _event(12, "membership", role="server", rank="server 2", change="added", live=3),
               _event(14, "recovery", rank="server 1", seconds=4.5, lost_updates=12),
               _event(16, "replica", server=0, what="restored", recovery_s=2.5, updates_lost_estimate=7),
               _trainer(20, 0, 100, 0.05)]
    root.mkdir()
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_json(root / "config.json", {"job_id": "el", "launch": {"trainers": 2, "servers": 2}})
    return load_run(root)


def test_membership_series_starts_from_the_launch_counts_and_follows_each_change(tmp_path):
    run = elastic_run(tmp_path / "run")
    series = ev.membership_series(run.events, ev.initial_counts(run.config), run.t0, T0 + 20)
    assert series["trainer"] == [(0.0, 2), (2.0, 3), (11.0, 2), (20.0, 2)]
    assert series["server"] == [(0.0, 2), (12.0, 3), (20.0, 3)]


def test_a_move_reports_the_longest_trainer_step_that_overlapped_it(tmp_path):
    run = elastic_run(tmp_path / "run")
    (move,) = ev.moves(run.events, run.trainers, run.t0)
    assert (move.started, move.seconds, move.servers, move.rows) == (6.0, 3.0, "2->3", 1000)
    # trainer 1's record at t=8 (0.5 s step) and trainer 0's at 9.5 (0.05) overlap 6..9;
    # the 0.9 s step ended at t=5, before the move
    assert move.longest_step == 0.5
    assert ev.longest_steps(run.trainers) == {0: 0.2, 1: 0.9}


def test_the_report_page_shows_the_elastic_section_and_draws_membership(tmp_path):
    run = elastic_run(tmp_path / "run")
    page = render_index(run, [], tmp_path)
    assert "<h2>Elastic job</h2>" in page
    assert "joined" in page and "2-&gt;3" in page and "Server recoveries" in page
    assert [(r["rank"], r["seconds"], r["lost_updates"]) for r in ev.recoveries(run.events)] == \
        [("server 1", 4.5, 12), ("server 0", 2.5, 7)]
    assert plot_membership(run, tmp_path / "m.png") is None
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_a_job_whose_membership_never_changed_has_no_elastic_section(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "metrics.jsonl").write_text(json.dumps(_event(0, "start")) + "\n" +
                                        json.dumps(_trainer(1, 0, 5, 0.1)) + "\n")
    run = load_run(root)
    assert "Elastic job" not in render_index(run, [], tmp_path)
    assert plot_membership(run, tmp_path / "m.png").startswith("not an elastic job")


def test_trainer_records_carry_the_longest_step_since_the_previous_record():
    now = [0.0]
    emitted = []
    records = TrainerRecords(0, emit=emitted.append, every=10.0, clock=lambda: now[0])
    for t in (1.0, 1.1, 3.1, 3.2):       # steps end at these times: the longest gap is 2.0
        now[0] = t
        records.on_step(int(t * 10), None, 0.0, 0.0)
    records.flush()
    assert emitted[-1]["step_max_s"] == 2.0
    now[0] = 3.5
    records.on_step(40, None, 0.0, 0.0)
    records.flush()
    assert abs(emitted[-1]["step_max_s"] - 0.3) < 1e-9     # reset after each record


def _stepped(t, trainer, step, longest, last_step_at=None, **more):
    """A record as trainers write them now: when their last step ended (step_end_t)."""
    return {**_trainer(t, trainer, step, longest), "step_end_t": T0 + (t if last_step_at is None else last_step_at),
            **more}


def stalled_run(root):
    """A move from 30.0 to 30.2 s. Trainer 1 is stuck in it from its last step at 29.9 and writes
    nothing more until the job ends at 95 (a 65.1 s stall); trainer 3 from its step at 20 until it
    is lost at 40; trainer 0 goes on, with one 1.5 s step in the move; trainer 2 finished at 10."""
    records = [_event(0, "start"),
               *[_stepped(t, 0, 10 * t, 0.05) for t in range(1, 30)],
               _stepped(30.5, 0, 300, 1.5), _stepped(31.5, 0, 320, 0.05),
               _stepped(60, 0, 900, 0.05, done=True),
               _stepped(1, 1, 10, 0.1), _stepped(29.9, 1, 290, 0.1),
               _stepped(5, 2, 50, 0.1), _stepped(10, 2, 100, 0.1, done=True),
               _stepped(20, 3, 200, 0.1),
               _event(30.2, "scale_end", servers_before=[0, 1], servers_after=[0, 1, 2], partitions=86, rows=10,
                      bytes=640, seconds=0.2),
               _event(40, "membership", role="trainer", rank="trainer 3", change="lost", live=3, trainer=3)]
    root.mkdir()
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(records, key=lambda r: r["t"])))
    write_json(root / "config.json", {"job_id": "st", "launch": {"trainers": 4, "servers": 2}})
    write_json(root / "summary.json", {"job_id": "st", "started": T0, "ended": T0 + 95, "exit_code": 0})
    return load_run(root)


def test_a_trainer_stuck_in_a_move_counts_to_the_jobs_end_and_steps_over_1_s_are_flagged(tmp_path):
    run = stalled_run(tmp_path / "run")
    ended = ev.job_end(run.summary, run.events, run.trainers)
    assert ended == T0 + 95
    (move,) = ev.moves(run.events, run.trainers, run.t0, ended)
    assert abs(move.longest_step - 65.1) < 1e-6, move           # not trainer 0's 1.5 s step, nor 0.05
    assert [(t, round(s, 3)) for t, s in move.slow] == [(0, 1.5), (1, 65.1), (3, 20.0)]
    assert {t: round(s, 3) for t, s in ev.longest_steps(run.trainers, run.events, ended).items()} == \
        {0: 1.5, 1: 65.1, 2: 0.1, 3: 20.0}
    page = render_index(run, [], tmp_path)
    assert "Trainer steps over 1 s during a move" in page and "trainer 1 65.10 s" in page and "65.10 (over 1 s)" in page


def test_a_move_no_trainer_waited_on_is_not_flagged(tmp_path):
    run = elastic_run(tmp_path / "run")
    (move,) = ev.moves(run.events, run.trainers, run.t0, ev.job_end(run.summary, run.events, run.trainers))
    assert move.longest_step == 0.5 and move.slow == ()
    assert "during a move:" not in render_index(run, [], tmp_path)
