"""Drive a MovePlan (placement/move_plan.py) over ServerLinks: send each Ready's steps, feed back
what came back. The only I/O of a move of partitions is here.

Each step has its own deadline (``timeout``, the job's PARAMSHARD_TIMEOUT unless given): a server
that refuses a step (an error reply), does not answer within it, or drops its connection fails
that step, and the plan aborts the move cleanly (MoveFailed names the server and the step).
A reply that comes after its step was given up is dropped (ServerLinks discards the ticket).
"""
from __future__ import annotations

from typing import Sequence

from paramshard.errors import ParamshardError
from paramshard.placement.move_plan import MovePlan, MoveRecord
from paramshard.transport.requests import Requests


def run_move(links: Requests, plan: MovePlan, timeout: float | None = None) -> MoveRecord:
    """Run ``plan`` to its end over ``links`` (which must reach every server of the plan's
    addresses); its MoveRecord, or MoveFailed / ConfigError as the plan raises them."""
    while (ready := plan.ready()) is not None:
        # The steps of one Ready go out together (the servers work in parallel), one ticket each,
        # so a failure is the failure of one named step.
        tickets = [links.submit([(step.server, step.header, step.arrays)], timeout) for step in ready.steps]
        replies, failed = [], None
        for index, ticket in enumerate(tickets):
            if failed is not None:
                links.discard(ticket)
                continue
            try:
                replies.append(links.collect(ticket)[0])
            except ParamshardError as exc:
                failed = (index, exc)
        if failed is not None:
            plan.fail(ready.number, *failed)
        else:
            plan.feed(ready.number, replies)
    return plan.result()


def connect_all(links, addresses: Sequence[str]) -> None:
    """Links to servers added since ``links`` was made (a scale up names them last)."""
    for index in range(len(links), len(addresses)):
        links.add_server(addresses[index])
