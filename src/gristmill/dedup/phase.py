"""The steps of a dedup's stages (`near_dedup_signature`, `exact_dedup_find`, ...): its phases.

A dedup step (`exact_dedup`, `near_dedup`) is one YAML entry planned into several stages. Its
`stages()` resolves everything its phases need once, into one plan object (`ExactDedupPlan`,
`NearDedupPlan`: the validated config, the values derived from it and from the run, the
folders of the stages), and hands that same object to every phase as `params`. The plan also
carries the YAML name of the step that made it: what the phases' errors name.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from gristmill.core.filter import Filter
from gristmill.core.step import Step


class DedupPlan(Protocol):
    #: YAML name of the step that planned the phases (`near_dedup`, `exact_dedup`)
    step: str


P = TypeVar("P", bound=DedupPlan)


class DedupPhase(Step, Generic[P]):
    """A step of one stage of a dedup: reads its parameters from the plan shared by all phases,
    `self.params` (the dedup's validated config is `params.config`; a phase is not written in
    YAML, so its own `config` is the empty one of `Step`)."""

    type = "🫂 DEDUP"

    def __init__(self, params: P, *, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.params = params


class DedupFilterPhase(DedupPhase[P], Filter):
    """The last phase: drops (or trims) documents by the earlier phases' decisions."""

    type = Filter.type  # a filter in stats and reports: its drops are counted by reason
