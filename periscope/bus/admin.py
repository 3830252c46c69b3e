"""Topic creation from the registry in periscope.bus.topics."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from periscope.bus import topics as registry
from periscope.bus.topics import Topic

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36


class TopicError(RuntimeError):
    """The broker refused to create a topic."""


async def ensure_topics(bootstrap: str, topics: Iterable[Topic] = registry.ALL, *,
                        replication_factor: int = 1, client_id: str = "periscope-admin") -> None:
    """Create the topics that do not exist yet, with the registry's partition counts.

    Existing topics are left alone; a partition count that differs from the registry is logged,
    because node-keyed inputs must stay co-partitioned for the joiner.
    """
    wanted = {t.name: t for t in topics}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    await admin.start()
    try:
        # list_topics asks for all topics; asking for unknown names would auto-create them on brokers
        # with auto-creation on (the embedded one), with a default partition count.
        existing = set(await admin.list_topics())
        new = [NewTopic(name, t.partitions, replication_factor)
               for name, t in wanted.items() if name not in existing]
        if new:
            try:
                response = await admin.create_topics(new)
            except TopicAlreadyExistsError:  # a concurrent creator won the race
                response = None
            for name, code, *rest in getattr(response, "topic_errors", ()):
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise TopicError(f"cannot create topic {name}: error {code} {rest[0] if rest else ''}")
        for meta in await admin.describe_topics(list(wanted)):
            name, count = meta["topic"], len(meta["partitions"])
            if count != wanted[name].partitions:
                log.warning("topic %s has %d partitions, the registry says %d", name, count,
                            wanted[name].partitions)
    finally:
        await admin.close()
