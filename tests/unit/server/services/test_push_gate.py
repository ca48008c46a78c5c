"""server/services/push_gate.py with an injected clock: the consistent cut of an async checkpoint, and
the gate as a request hook (hold, note applied, resume by itself after the timeout)."""
from paramshard.mode import Mode
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.services.push_gate import PushGate, PushGateHook

from tests.unit.server_fakes import Clock, context


def push(trainer, step, op="push_dense", frames="frames", table="t"):
    return Incoming(op, {"step": step, "table": table}, trainer, held=(op, trainer, step) if frames else None)


def test_pause_reports_the_last_step_applied_per_stream_and_trainer():
    gate = PushGate(5.0, clock=Clock())
    for stream, trainer, step in [("dense", 0, 3), ("dense", 0, 2), ("dense", 1, 4), ("sparse:t", 0, 1)]:
        gate.note_applied(stream, trainer, step)
    assert gate.pause() == [["dense", 0, 3], ["dense", 1, 4], ["sparse:t", 0, 1]]
    assert gate.paused and gate.should_hold(0, 0)          # before the cut: everything is held


def test_the_cut_lets_through_pushes_up_to_it_and_names_the_missing_ones():
    gate = PushGate(5.0, clock=Clock())
    gate.pause()
    gate.held = [(0, 4, "a"), (1, 6, "b"), (0, 5, "c")]
    released = gate.set_cut({0: 4, 1: 5})
    assert released == [(0, 4, "a")] and gate.held == [(1, 6, "b"), (0, 5, "c")]
    gate.note_applied("dense", 0, 4)
    assert gate.missing(["dense"]) == [("dense", 1, 5)]
    gate.note_applied("dense", 1, 5)
    assert gate.missing(["dense"]) == []
    assert gate.resume() == [(1, 6, "b"), (0, 5, "c")] and not gate.paused


def test_a_pause_without_resume_expires_after_the_timeout():
    clock = Clock()
    gate = PushGate(5.0, clock=clock)
    gate.pause()
    clock.now += 5.0
    assert not gate.expired()
    clock.now += 0.01
    assert gate.expired()


def test_the_hook_holds_pushes_of_async_mode_only_and_hands_them_back_in_order():
    clock = Clock()
    ctx = context(Mode.ASYNC, clock=clock)
    gate = PushGate(ctx.timeout, clock=clock)
    hook = PushGateHook(gate, ctx)
    assert hook.admit(push(0, 1)) is Verdict.ACCEPT
    gate.pause()
    assert hook.admit(push(0, 1)) is Verdict.HOLD
    assert hook.admit(push(1, 2, op="push_sparse")) is Verdict.HOLD
    assert hook.admit(Incoming("pull_dense", {}, 0, held="f")) is Verdict.ACCEPT     # pulls are never held
    assert hook.admit(push(0, 1, frames=None)) is Verdict.ACCEPT    # the in-process path holds nothing
    sync_hook = PushGateHook(gate, context(Mode.SYNC, clock=clock))
    assert sync_hook.admit(push(0, 1)) is Verdict.ACCEPT              # sync mode needs no cut
    clock.now += 6.0
    hook.tick()                                                       # the chief died mid-save
    assert ctx.resubmitted == [("push_dense", 0, 1), ("push_sparse", 1, 2)] and not gate.paused


def test_the_hook_notes_applied_steps_per_stream():
    ctx = context(Mode.ASYNC)
    gate = PushGate(ctx.timeout)
    hook = PushGateHook(gate, ctx)
    hook.applied(push(1, 7))
    hook.applied(push(0, 2, op="push_sparse", table="emb"))
    hook.applied(Incoming("pull_dense", {}, 0))
    assert gate.applied == {"dense": {1: 7}, "sparse:emb": {0: 2}}
