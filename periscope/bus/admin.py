"""Topic creation from the registry in periscope.bus.topics.

`python -m periscope.bus.admin [--bootstrap HOST:PORT] [--replication-factor N]` creates every topic
(the deployment's one-shot topics job); the bootstrap defaults to PERISCOPE_KAFKA_BOOTSTRAP.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Iterable, Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from periscope.bus import topics as registry
from periscope.bus.topics import Topic
from periscope.config import ServiceSettings

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m periscope.bus.admin",
                                     description="Create every Periscope topic that does not exist yet.")
    parser.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT (default: PERISCOPE_KAFKA_BOOTSTRAP)")
    parser.add_argument("--replication-factor", type=int, default=1, help="for new topics (default 1)")
    args = parser.parse_args(argv)  # exits 2 with one usage line on bad input
    if args.replication_factor < 1:
        parser.error("--replication-factor must be at least 1")
    bootstrap = args.bootstrap or ServiceSettings().kafka_bootstrap
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(ensure_topics(bootstrap, replication_factor=args.replication_factor))
    except Exception as e:  # the job is retried by its controller; one clear line beats a traceback
        print(f"periscope.bus.admin: cannot create topics on {bootstrap}: {e or type(e).__name__}",
              file=sys.stderr)
        return 1
    print(f"topics ready on {bootstrap}: {len(registry.ALL)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
