"""Topic creation from the registry in periscope.bus.topics.

`python -m periscope.bus.admin [--bootstrap HOST:PORT] [--replication-factor N]` creates every topic
(the deployment's one-shot topics job); the bootstrap defaults to PERISCOPE_KAFKA_BOOTSTRAP and the
TLS/SASL settings come from PERISCOPE_KAFKA_SECURITY_PROTOCOL and friends (periscope.bus.security).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Iterable, Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from pydantic import ValidationError

from periscope.bus import topics as registry
from periscope.bus.diagnosis import check_connection
from periscope.bus.security import PLAINTEXT, KafkaSecurity, KafkaSecurityError
from periscope.bus.topics import Topic
from periscope.config import ServiceSettings

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36


class TopicError(RuntimeError):
    """The broker refused to create a topic."""


async def ensure_topics(bootstrap: str, topics: Iterable[Topic] = registry.ALL, *,
                        replication_factor: int = 1, client_id: str = "periscope-admin",
                        security: KafkaSecurity = PLAINTEXT) -> None:
    """Create the topics that do not exist yet, with the registry's partition counts.

    Existing topics are left alone; a partition count that differs from the registry is logged,
    because node-keyed inputs must stay co-partitioned for the joiner.
    """
    wanted = {t.name: t for t in topics}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id,
                                **security.aiokafka_kwargs())
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
    try:
        settings = ServiceSettings()
    except ValidationError as e:  # name the first bad variable, in one line
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "settings"
        print(f"periscope.bus.admin: PERISCOPE_{where.upper()}: {err.get('msg', 'invalid value')}",
              file=sys.stderr)
        return 2
    bootstrap, security = args.bootstrap or settings.kafka_bootstrap, settings.kafka_security()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # aiokafka logs each failed connection attempt; the cause is reported once, below.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        asyncio.run(_create(bootstrap, args.replication_factor, security))
    except KafkaSecurityError as e:
        print(f"periscope.bus.admin: cannot connect to {bootstrap}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the job is retried by its controller; one clear line beats a traceback
        print(f"periscope.bus.admin: cannot create topics on {bootstrap}: {e or type(e).__name__}",
              file=sys.stderr)
        return 1
    print(f"topics ready on {bootstrap}: {len(registry.ALL)}")
    return 0


async def _create(bootstrap: str, replication_factor: int, security: KafkaSecurity) -> None:
    await check_connection(bootstrap, security)
    await ensure_topics(bootstrap, replication_factor=replication_factor, security=security)


if __name__ == "__main__":
    sys.exit(main())
