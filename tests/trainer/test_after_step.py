"""`after_step`: what the loop does after a step's update (validate, checkpoint, stop), decided
from the step, the config and the signals alone: a table of cases."""

from __future__ import annotations

import dataclasses

import pytest

from gristmill.trainer.config import load as load_config
from gristmill.trainer.train import Actions, Signals, after_step

# 10 steps, validation every 2 steps, a checkpoint every 3, unless a case overrides them
BASE = ["data.tokens=x", "steps=10", "eval.every=2", "eval.batches=2", "checkpoint.every=3"]

NOTHING = Actions()
EVAL = Actions(evaluate=True)
SAVE = Actions(save=True)
BOTH = Actions(evaluate=True, save=True)
LAST = Actions(evaluate=True, save=True, stop=True, reason="steps")
PREEMPTED = Actions(save=True, stop=True, reason="preempted")
PREEMPTED_EVAL = Actions(evaluate=True, save=True, stop=True, reason="preempted")  # on an eval step or the end
QUIET = Signals()
PREEMPT = Signals(preempted=True)

CASES = {
    # periodic: validation every 2 steps, checkpoints every 3, both at 6
    "between intervals": ([], 1, QUIET, NOTHING),
    "eval interval": ([], 2, QUIET, EVAL),
    "checkpoint interval": ([], 3, QUIET, SAVE),
    "both intervals": ([], 6, QUIET, BOTH),
    "after both intervals": ([], 7, QUIET, NOTHING),
    # the last step validates, checkpoints and stops, on no interval
    "last step": ([], 10, QUIET, LAST),
    "last step on an interval": (["steps=12"], 12, QUIET, LAST),
    "every=0: nothing before the end": (["eval.every=0", "checkpoint.every=0"], 6, QUIET, NOTHING),
    "every=0: all at the end": (["eval.every=0", "checkpoint.every=0"], 10, QUIET, LAST),
    # preemption (any rank's flag, as read so far) checkpoints and stops at once, mid-interval too
    "preempted mid-interval": ([], 5, PREEMPT, PREEMPTED),
    "preempted on an eval step": ([], 4, PREEMPT, PREEMPTED_EVAL),
    "preempted on a checkpoint step": ([], 3, PREEMPT, PREEMPTED),
    "preempted on the last step": ([], 10, PREEMPT, PREEMPTED_EVAL),
    "preempted at step 1": ([], 1, PREEMPT, PREEMPTED),
    # stop_after ends the run like the last step (the schedule still spans `steps`)
    "before stop_after": (["stop_after=5"], 4, QUIET, EVAL),
    "stop_after": (["stop_after=5"], 5, QUIET, Actions(evaluate=True, save=True, stop=True, reason="stop_after")),
    "stop_after on a checkpoint step": (
        ["stop_after=3"],
        3,
        QUIET,
        Actions(evaluate=True, save=True, stop=True, reason="stop_after"),
    ),
    "stop_after = steps": (["stop_after=10"], 10, QUIET, LAST),
    "stop_after beyond steps": (["stop_after=50"], 10, QUIET, LAST),
    "stop_after, preempted first": (["stop_after=5"], 4, PREEMPT, PREEMPTED_EVAL),
    # checkpoints off: never a save, stops as before
    "no checkpoints: interval": (["checkpoint.enabled=false"], 3, QUIET, NOTHING),
    "no checkpoints: eval interval": (["checkpoint.enabled=false"], 6, QUIET, EVAL),
    "no checkpoints: last step": (
        ["checkpoint.enabled=false"],
        10,
        QUIET,
        Actions(evaluate=True, stop=True, reason="steps"),
    ),
    "no checkpoints: preempted": (["checkpoint.enabled=false"], 5, PREEMPT, Actions(stop=True, reason="preempted")),
    # no validation: eval.batches 0, or no validation split in the token directory
    "eval.batches 0: eval interval": (["eval.batches=0"], 2, QUIET, NOTHING),
    "eval.batches 0: both intervals": (["eval.batches=0"], 6, QUIET, SAVE),
    "eval.batches 0: last step": (["eval.batches=0"], 10, QUIET, Actions(save=True, stop=True, reason="steps")),
    "no val split: last step": ([], 10, Signals(val_data=False), Actions(save=True, stop=True, reason="steps")),
    "no val split: eval interval": ([], 4, Signals(val_data=False), NOTHING),
    "nothing on: last step": (
        ["checkpoint.enabled=false", "eval.batches=0"],
        10,
        QUIET,
        Actions(stop=True, reason="steps"),
    ),
    "nothing on: mid-run": (["checkpoint.enabled=false", "eval.batches=0"], 6, QUIET, NOTHING),
}


@pytest.mark.parametrize("overrides, step, signals, want", CASES.values(), ids=CASES.keys())
def test_after_step(overrides, step, signals, want):
    cfg = load_config("tiny", BASE + overrides)
    got = after_step(step, cfg, signals)
    assert got == want
    assert got.acts == (want != NOTHING)
    assert after_step(step, cfg, signals) == got  # pure: asked again, the same answer


def test_a_step_that_acts_and_one_that_does_not():
    cfg = load_config("tiny", BASE)
    assert not after_step(1, cfg, QUIET).acts
    assert all(after_step(s, cfg, QUIET).acts for s in (2, 3, 10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        after_step(1, cfg, QUIET).stop = True


def test_only_the_last_step_stops_a_quiet_run():
    """Over a whole run without preemption: validation and checkpoints where the intervals and
    the end say, and exactly one stop, at the last step."""
    cfg = load_config("tiny", BASE)
    plan = {s: after_step(s, cfg, QUIET) for s in range(1, 11)}
    assert [s for s, a in plan.items() if a.evaluate] == [2, 4, 6, 8, 10]
    assert [s for s, a in plan.items() if a.save] == [3, 6, 9, 10]
    assert [s for s, a in plan.items() if a.stop] == [10]
