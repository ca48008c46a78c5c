"""Server 0's turn-taking between checkpoints and server moves (pure; CheckpointService serves it).

A checkpoint reads every server's rows page by page; a move's hand-offs freeze partitions on
one server and make them rows on another, and its end drops the rows handed away (compacting
the others under the pages). A checkpoint read across either would miss rows or hold some
twice. So the two take turns on server 0, which every move and every checkpoint talk to
first: a checkpoint (``exclude_begin`` who=checkpoint) waits while a move is in its
hand-off phase (from its first hand-off to its final routing), and a move's hand-off phase
(who=move) waits for a checkpoint in progress. The copy before the hand-offs needs no turn:
the old owners still own every row, the new ones hold only staged pages, not rows.

Sync mode: the move's phase begins only once server 0 completed the step before the switch
(``after_step``), since the hand-off waits for it anyway: holding the turn before that would
keep the chief from checkpointing an earlier step, and the step it waits for would never come.
"""
from __future__ import annotations

from typing import Callable


class MoveExclusion:
    def __init__(self):
        self.checkpoint: int | None = None     # the trainer whose checkpoint is in progress
        self.moving = False                    # a move is in its hand-off phase

    def checkpoint_may_begin(self, trainer: int) -> bool:
        return not self.moving and self.checkpoint in (None, trainer)

    def begin_checkpoint(self, trainer: int) -> None:
        self.checkpoint = trainer

    def move_may_begin(self, completed: Callable[[int], bool], after_step: int | None) -> bool:
        return (self.checkpoint is None and not self.moving
                and (after_step is None or completed(after_step)))

    def begin_move(self) -> None:
        self.moving = True

    def end(self, who: str, trainer: int | None = None) -> None:
        if who == "move":
            self.moving = False
        elif self.checkpoint == trainer:
            self.checkpoint = None

    def holder(self) -> str:
        if self.moving:
            return "a move of partitions in its hand-off phase"
        if self.checkpoint is not None:
            return f"trainer {self.checkpoint}'s checkpoint"
        return "nothing"
