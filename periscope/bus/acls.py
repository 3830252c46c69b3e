"""Which Kafka principal may do what: one principal per service, each allowed only its own part.

Probes write node topics, the watcher writes cluster topics, the joiner reads the inputs and writes the
outputs and its own changelogs, the API only reads (and dead-letters what it cannot decode), the
admin (topics job, and an operator's replay) creates and reads. Nobody but the joiner can write the
output topics, so nothing written by anyone else can change what the API serves. This table is what
`periscope up --broker kafka --secure` grants, what docs/deploy.md's `kafka-acls` commands and
deploy/'s Strimzi KafkaUsers say (a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from periscope.bus import topics as t

ResourceType = Literal["topic", "group", "cluster"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal["All", "Read", "Write", "Create", "Describe", "DescribeConfigs", "AlterConfigs"]

SERVICES = ("probe", "watcher", "joiner", "api", "admin")
NODE_PREFIX = "periscope.node."
CLUSTER_PREFIX = "periscope.cluster."


@dataclass(frozen=True, slots=True)
class Acl:
    resource: ResourceType
    name: str
    pattern: Pattern
    operations: tuple[Operation, ...]


def _topic(name: str, *ops: Operation, prefixed: bool = False) -> Acl:
    return Acl("topic", name, "prefixed" if prefixed else "literal", ops)


def service_acls(joiner_app_id: str = "periscope-joiner") -> dict[str, tuple[Acl, ...]]:
    """Every service's ACLs (all ALLOW, any host); the joiner's group and changelog topics are named
    after its application id. The API reads without a consumer group (it assigns partitions itself)."""
    read: tuple[Operation, ...] = ("Read", "Describe")
    inputs = (_topic(NODE_PREFIX, *read, prefixed=True), _topic(CLUSTER_PREFIX, *read, prefixed=True))
    dead_letters = _topic(t.DEADLETTER.name, "Write", "Describe")
    return {
        "probe": (_topic(NODE_PREFIX, "Write", "Describe", prefixed=True),),
        "watcher": (_topic(CLUSTER_PREFIX, "Write", "Describe", prefixed=True),),
        "joiner": (
            *inputs,
            *(_topic(o.name, "Write", "Describe") for o in t.OUTPUTS),
            dead_letters,
            Acl("group", joiner_app_id, "literal", ("Read",)),
            # Faust's tables (changelogs) and its assignor's topic are named <app id>-...
            _topic(f"{joiner_app_id}-", "All", prefixed=True),
        ),
        "api": (
            *(_topic(o.name, *read) for o in t.OUTPUTS),
            *inputs,  # the cluster topics for the view, the node topics for /v1/owners
            dead_letters,
        ),
        "admin": (
            _topic("periscope.", "Create", "Describe", "DescribeConfigs", "AlterConfigs", "Read",
                   prefixed=True),
        ),
    }


def kafka_acls_commands(joiner_app_id: str = "periscope-joiner", principal: str = "User:periscope-{service}"
                        ) -> list[str]:
    """The same grants as `kafka-acls.sh` command lines (docs/deploy.md)."""
    lines = []
    for service, acls in service_acls(joiner_app_id).items():
        for acl in acls:
            flag = {"topic": "--topic", "group": "--group", "cluster": "--cluster"}[acl.resource]
            target = flag if acl.resource == "cluster" else f"{flag} '{acl.name}'"
            ops = " ".join(f"--operation {op}" for op in acl.operations)
            lines.append("kafka-acls.sh --bootstrap-server $BOOTSTRAP --command-config admin.properties "
                         f"--add --allow-principal {principal.format(service=service)} {ops} {target} "
                         f"--resource-pattern-type {acl.pattern}")
    return lines
