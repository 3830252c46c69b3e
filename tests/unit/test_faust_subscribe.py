"""The joiner consumer subscribes only once the broker's metadata lists its topics
(periscope.bus.faust_transport.listed): a topic just created can be missing from it for a moment, and
Faust's assignor leaves a missing topic out of the assignment until the next metadata refresh."""

from __future__ import annotations

from periscope.bus.faust_transport import listed


class Metadata:
    """What the wait reads of aiokafka's ClusterMetadata: a topic's partitions, None when unknown."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.topics.get(topic)
        return set(range(count)) if count else None


class Broker:
    """Answers metadata requests; a topic shows from the `shows_at`-th answer on (counted from 1)."""

    def __init__(self, shows_at: dict[str, int]) -> None:
        self.shows_at = shows_at
        self.asked = 0

    async def fetch(self) -> Metadata:
        self.asked += 1
        return Metadata({t: 4 for t, n in self.shows_at.items() if self.asked >= n})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


async def test_topics_already_listed_need_one_request() -> None:
    broker, clock = Broker({"a": 1, "b": 1}), Clock()
    assert await listed(broker.fetch, {"a", "b"}, 30, clock=clock, sleep=clock.sleep) == set()
    assert broker.asked == 1 and clock.slept == []


async def test_it_asks_again_until_a_late_topic_shows() -> None:
    broker, clock = Broker({"a": 1, "marks-changelog": 4}), Clock()
    assert await listed(broker.fetch, {"a", "marks-changelog"}, 30, clock=clock, sleep=clock.sleep) == set()
    assert broker.asked == 4
    assert clock.slept == [0.05, 0.1, 0.2]  # backing off


async def test_it_gives_up_at_the_limit_and_names_what_is_missing() -> None:
    broker, clock = Broker({"a": 1}), Clock()
    missing = await listed(broker.fetch, {"a", "never"}, 5, clock=clock, sleep=clock.sleep)
    assert missing == {"never"}
    assert 5 <= clock.now < 6 and max(clock.slept) == 1.0  # the backoff is capped
