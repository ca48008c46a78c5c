"""``--geo-k auto``: k, the local steps between two sends, chosen and adapted from what each
round measured (geo/schedule.py Round), with nothing for the user to tune.

Why k matters, per round of k steps on one trainer:

- compute grows linearly: C(k) = c*k (c: seconds per local step);
- the wire barely grows: W(k) = latency + the touched rows' bytes / rate, and the rows k
  steps touch grow sublinearly in k (CTR ids repeat: the hot rows are touched every step
  and sent once), so W(k) = w0 + b*k^a with a < 1;
- hence the wire's share of a round, W/(W+C), falls as k grows, and a larger k amortises the
  send (Paddle's GEO-SGD gets its throughput this way, with k picked by hand: its docs use
  ``a_sync_configs = {"k_steps": 100 | 400 | 10000}``);
- but the replica goes stale: what the others changed while this trainer trained alone
  (``drift_norm``, relative to the values it touched, ``value_norm``) grows with k, and a
  stale replica computes gradients against the wrong model, which costs AUC. Local-SGD
  studies show both sides: AdaComm (Wang & Joshi 2018) lowers the period as the loss falls
  to reach a lower error floor; post-local SGD (Lin et al. 2020) trains synchronously while
  the model changes fast and only later lets k grow. Both are schedules over *time*; the
  measured drift says the same thing directly (it is large when the model moves fast) and
  needs no loss curve or schedule constants.

The policy: the smallest k at which the wire is a small share of a round, unless the drift
says the replica would be too stale by then, and never over the bound:

    k_wire  = (W/c) * (1 - WIRE_SHARE) / WIRE_SHARE   (the k whose wire share is WIRE_SHARE)
    k_drift = k * (DRIFT_TARGET / (drift/value))^(1/power)
                                 (the k whose relative drift is DRIFT_TARGET; power: fitted, below)
    target  = min(k_wire, k_drift)

A smaller k than k_wire buys freshness at more than WIRE_SHARE of the time; a larger one
buys at most WIRE_SHARE more throughput with more staleness: so k_wire shrinks k too when
the link is fast (k -> 1 on loopback or a fast link, where GEO then behaves like async).

Each round's target is computed from that round alone, and k follows the **median of the
last WINDOW targets** (one stalled send, a GC pause or one round in which no other trainer's send
landed does not swing k; a change that lasts two rounds does) but grows no further than the
latest round's own target (the median lags: an outlier may hold k for a round, never move it).
k moves **the whole way to that goal** in one round, at most x MAX_GROW and / MAX_SHRINK (a ratio
controller in log k, k' = k * goal/k). Why it settles: in log k the update is
log k' = log target(k). At the wire's fixed point k_wire = W(k)/c * const grows with log k at a
slope in [0, a], a < 1 (the rows touched grow sublinearly): it converges geometrically, monotonically.
At the drift's, relative drift grows as k^beta (beta = 1/2 for noise, 1 for a steady gradient
direction) and k_drift reads it as k^power: update slope 1 - beta/power, 0 (one round) once
power is fitted to beta, in (-1, 1) for any beta < 2*power before; shrinking reads power >= 1,
so from above it comes down without passing under. Under stationary measurements it stays
within rounding of the fixed point.

Why WINDOW = 3 and no damping (they were 5 and 1/2): the drift is not stationary. It falls as
the model settles, as about 0.3 * sqrt(k / step) on the CTR demo at 100 Mbit/s (RESULTS section
23: k = 16 at step 21 drifted 0.33, k = 64 over steps 5-69 0.33, k = 128 over 5-133 0.34, k = 64
over 197-261 0.16 and k = 128 over 133-261 0.25), so the k whose drift meets the target grows
about x4 a round in the first hundred steps. A five-round median held the first rounds' small
targets while the drift fell, and half steps halved what was left: auto-k sat at k = 16-36 for
steps 21-142, where k = 128 ran at the target, and reached held-out AUC 0.770 24% behind k = 64
and k = 128 (17.8 s against 14.4, one run). Three rounds still outvote one outlier.

The two targets are calibrated, not derived (CTR demo, 2 servers + 2 trainers on this 2-core
machine). DRIFT_TARGET: on 100 Mbit/s links over an epoch (305 steps, RESULTS section 23) hand-
picked k = 16 and k = 64 both reached sync's test AUC (0.7768), k = 64 with settled drifts of
0.34, 0.25, 0.19, 0.16, 0.12 round by round and k = 16 with about the same at the same steps:
the relative drift falls as the model settles and hardly depends on k there, so the target
decides *when* k may grow. At 25% it held k at 8-11 for the first 50 steps (2.55x async, 22-25%
behind k = 64 to a held-out AUC); at 35% k passes 16 within 3 rounds and 60-80 by the end
(2.80x async, 14% behind k = 64), with the same test AUC over the epoch and over 105 steps
(0.7692 against sync's 0.7694). WIRE_SHARE: a trainer's wire time misses what the servers'
work takes from the trainers when they share cores (k = 5 trained 29,660 samples/s, k = 16
42,989, at a measured wire share of 6-9%, loopback), so it is 5%, not the 10% the wire alone
would suggest.

How relative drift grows with k is measured, not assumed: its exponent is the least-squares
slope of log drift on log k over the window's rounds (once their ks span x FIT_SPAN; until then
DRIFT_POWER), clamped to [DRIFT_POWER, MAX_POWER], and k_drift = k * (target/relative)^(1/power).
Why: what the others changed in k steps is a sum of k noisy updates (a random walk, power 1/2),
not k times one. Measured (CTR demo, 2 servers + 2 trainers, 100 Mbit/s links, the geo_round
records of k = 8 and k = 16 over the same steps): doubling k multiplied the relative drift by
1.46-1.54 (power 0.55-0.62). The earlier rule read drift as linear in k: its k_drift asked for
half the growth the drift allowed, and with the median's lag and the damping auto-k spent its
whole 100-step benchmark ramping (4 -> 16 at 100 Mbit/s, while k = 16 trained 23% faster at the
same AUC). The fixed point (where the drift meets DRIFT_TARGET) is the same; it is reached
faster, and a steeper drift (a steady gradient direction) is fitted after two changes of k, so
k passes it by one growth step at most. Shrinking reads drift as at least linear: k comes down to the
limit from above instead of under it and back up (staleness is the costlier error).

Which values the drift is read over: the *settled* ones (Round.settled_*: the dense values and
the rows this trainer's own change in the round moved by less than their size; geo/replica.py
TableReplica.merged), when the round measured them. A row the servers created a few steps ago
is near zero and changes by about its own size in any round, so over all rows the first rounds
drift over the target at any k: measured at 100 Mbit/s (RESULTS section 23) the first round's
0.40 took k from 4 to 3 and the drift held it at 3-8 while the wire asked for 60-90, yet k = 16
ran those rounds at a drift of 0.44-0.52 with sync's AUC. Over the settled rows the first round
drifted 0.05 (CTR demo, 2 + 2, loopback, k = 4: tests/unit/geo/test_auto_k.py RECORDED_YOUNG);
once the rows have grown (k = 4: from step 17, k = 16: 37) the two agree within 11%, so the
rule guards the same staleness then. A round with nothing settled (a model without dense
values, in its first round) measured no drift: the wire decides it, and k grows at most x2.

It starts small (``START``, 4 steps: the first rounds measure the drift of a short interval,
when the model moves fastest, and the doubling reaches 256 in 6 rounds), and every k it
returns is clamped to 1 <= k <= bound (``--max-staleness``, else ``DEFAULT_BOUND``), which
no measurement can override. A round that measured nothing usable (no steps, a non-finite
figure) keeps k as it is.
"""
from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import TYPE_CHECKING

from paramshard.geo.schedule import Round

DEFAULT_BOUND = 1024     # without --max-staleness: at most this many local steps between sends
START = 4                # k of the first round
WIRE_SHARE = 0.05        # the wire's share of a round's time k aims at (see below: calibrated)
DRIFT_TARGET = 0.35      # relative drift (the others' change missed / values touched) a round may show
DRIFT_POWER = 0.5        # relative drift grows at least as k^DRIFT_POWER (a random walk; measured 0.55-0.62) ...
MAX_POWER = 4.0          # ... and at most as k^MAX_POWER: the fitted exponent is clamped to these
FIT_SPAN = 1.5           # the exponent is fitted once the window's rounds span k by this factor
FIT_WINDOW = 5           # ... over this many rounds' drifts (the first round that drifted left out) ...
EMPTY_ROUND = 4.0        # ... but those under 1/EMPTY_ROUND of their median (nothing landed in them)
WINDOW = 3               # targets of this many rounds are smoothed by their median
DAMPING = 1.0            # fraction (in log k) of the way to the target moved per round
MAX_GROW = 2.0           # k grows at most x2 per round ...
MAX_SHRINK = 4.0         # ... and shrinks at most /4 (staleness is the costlier error)
TINY = 1e-12             # below this a time or a norm counts as zero


class AutoK:
    """A GeoSchedule that adapts k from the measured rounds (the module's docstring says how)."""

    def __init__(self, bound: int | None = None, *, start: int = START, wire_share: float = WIRE_SHARE,
                 drift_target: float = DRIFT_TARGET, window: int = WINDOW, damping: float = DAMPING):
        bound = DEFAULT_BOUND if bound is None else bound
        if bound < 1:
            raise ValueError(f"--geo-k auto with --max-staleness {bound}: GEO sends after at least 1 local "
                             f"step, so the bound must be at least 1 (or use --mode sync for none)")
        if not 0 < wire_share < 1 or drift_target <= 0 or window < 1 or not 0 < damping <= 1:
            raise ValueError(f"AutoK: wire_share {wire_share} must be in (0, 1), drift_target {drift_target} "
                             f"over 0, window {window} at least 1, damping {damping} in (0, 1]")
        self.bound = int(bound)
        self.wire_share, self.drift_target, self.damping = wire_share, drift_target, damping
        self.k = self._clamp(start)
        self._level = float(self.k)          # k before rounding: small moves accumulate
        self._targets: deque[float] = deque(maxlen=window)
        self._drifts: deque[tuple[float, float]] = deque(maxlen=FIT_WINDOW)    # (log k, log relative drift)
        self._drifted_rounds = 0
        self.power = DRIFT_POWER             # how relative drift grows with k (fitted: _fit_power)

    def first_k(self) -> int:
        return self.k

    def next_k(self, done: Round) -> int:
        self._fit_power(done)
        target = self.target_of(done)
        if target is not None:
            self._targets.append(target)
            goal = median(self._targets)
            if goal > self._level:
                # Grow only as far as this round allows too: the median lags, and k overshooting
                # the drift's limit is staleness paid for nothing. (An outlier then holds k for a
                # round; it never moves it.)
                goal = max(self._level, min(goal, target))
            ratio = (goal / self._level) ** self.damping
            ratio = min(MAX_GROW, max(1.0 / MAX_SHRINK, ratio))
            self._level = min(float(self.bound), max(1.0, self._level * ratio))
            self.k = self._clamp(self._level)
        return self.k

    def target_of(self, done: Round) -> float | None:
        """The k this round alone asks for (not yet clamped), or None when it measured nothing usable."""
        drift, value = drift_figures(done)
        figures = (done.compute_seconds, done.wire_seconds, drift, value)
        if done.steps < 1 or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in figures):
            return None
        per_step = done.compute_seconds / done.steps
        if done.wire_seconds <= TINY:
            k_wire = 1.0                    # a free send: send every step, the replica is never stale
        elif per_step <= TINY:
            k_wire = float(self.bound)      # free steps: the wire is the whole round at any k
        else:
            k_wire = done.wire_seconds / per_step * (1 - self.wire_share) / self.wire_share
        if drift <= TINY or value <= TINY:
            k_drift = math.inf              # nothing missed (one trainer, nobody else sent), or nothing settled yet
        else:
            relative = drift / value
            # Relative to the k the round ran: a short last round of an epoch drifted less.
            # Growing, the fitted exponent (a random walk's at least); shrinking, at least linear:
            # k then comes down to the drift's limit from above, never under it and back up.
            power = self.power if relative <= self.drift_target else max(self.power, 1.0)
            k_drift = done.steps * (self.drift_target / relative) ** (1 / power)
        return min(float(self.bound), max(1.0, min(k_wire, k_drift)))

    def _fit_power(self, done: Round) -> None:
        """The exponent of relative drift in k: the least-squares slope of log drift on log k over
        the last FIT_WINDOW rounds that drifted (not the first; not those in which nothing
        landed), once their k spans FIT_SPAN (before, and while k stays put, the last fit holds;
        at first DRIFT_POWER), clamped to [DRIFT_POWER, MAX_POWER]: a steep drift (a steady
        gradient direction) is read as such after two changes of k, so k_drift passes it by one
        growth step at most, and a noisy fit never asks for faster growth than a random walk allows."""
        drift, value = drift_figures(done)
        if done.steps < 1 or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > TINY for x in (drift, value)):
            return
        self._drifted_rounds += 1
        if self._drifted_rounds == 1:
            # The first round that drifted saw the others' change over part of it at most: their
            # first sends land near its end (recorded: 0.04 at k = 4, then 0.33 at k = 16, which
            # fitted a power of 1.47 and held k at 16-18 for three rounds).
            return
        self._drifts.append((math.log(done.steps), math.log(drift / value)))
        # A round in which no other trainer's send landed (rounds of about equal length see 0, 1
        # or 2 of them; recorded: 0.045 and 0.014 between rounds of 0.19-0.25) says nothing of k.
        floor = median(y for _, y in self._drifts) - math.log(EMPTY_ROUND)
        points = [(x, y) for x, y in self._drifts if y >= floor]
        xs = [x for x, _ in points]
        if max(xs) - min(xs) < math.log(FIT_SPAN):
            return
        mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(xs)
        slope = (sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs))
        self.power = min(MAX_POWER, max(DRIFT_POWER, slope))

    def _clamp(self, k: float) -> int:
        return max(1, min(self.bound, int(round(k))))


def drift_figures(done: Round) -> tuple[float, float]:
    """(drift, value) norms the drift rule reads: over the settled values when the round measured
    them (young rows left out: geo/replica.py TableReplica.merged), else over all it touched."""
    if done.settled_value_norm is None or done.settled_drift_norm is None:
        return done.drift_norm, done.value_norm
    return done.settled_drift_norm, done.settled_value_norm


if TYPE_CHECKING:   # `make typecheck` checks the contract: GeoSchedule (geo/schedule.py)
    from paramshard.geo.schedule import GeoSchedule
    _schedule: type[GeoSchedule] = AutoK
