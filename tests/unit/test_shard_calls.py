"""A shard actor's calls to the other shards (actors/spawn.py): an incarnation that died
answers Unavailable (a QueueError, which the dead letters' route retries and a handover's
take-backs step over) and its handle is forgotten, so the next call asks Ray for the shard
by name. A Ray call's failure is made here by a stand-in handle that raises what Ray raises
for a dead actor; the test_actor_ray integration tests run the calls on real actors."""

from __future__ import annotations

from typing import Any

import pytest
import ray.exceptions

from actors import spawn
from actors.errors import Unavailable
from actors.spawn import ShardActor


class _Method:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def remote(self, *args: Any) -> Any:
        async def answer() -> Any:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

        return answer()


class _Handle:
    def __init__(self, outcome: Any) -> None:
        self.execute_many = self.take_back = _Method(outcome)


def _actor(handles: dict[int, Any]) -> ShardActor:
    actor = object.__new__(ShardActor)  # no store, no shard: only its calls to others
    actor.index = 0
    actor._handles = handles
    return actor


@pytest.mark.parametrize(
    "death",
    [ray.exceptions.ActorDiedError(), ray.exceptions.ActorUnavailableError("gone", None)],
    ids=["died", "unavailable"],
)
async def test_a_dead_shard_answers_unavailable_and_is_looked_up_again(
    death: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor = _actor({1: _Handle(death)})
    with pytest.raises(Unavailable, match="shard 1 is restarting"):
        await actor._remote(1, "take_back", "q", 7)
    assert 1 not in actor._handles  # forgotten: the next call asks Ray by name
    fresh = _Handle(["ok"])
    monkeypatch.setattr(spawn.ray, "get_actor", lambda name, namespace: fresh)
    assert await actor._remote(1, "execute_many", "q", []) == ["ok"]
    assert actor._handles[1] is fresh
