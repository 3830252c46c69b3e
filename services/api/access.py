"""Who may see what: the caller's `Scope` and the pure filters that apply it to rendered rows.

A scope is decided from Kubernetes reviews (services.api.auth): a cluster-wide allow of `list pods`
means everything, otherwise the set of namespaces where `list pods` was allowed. Everything here is
pure and works on the rendered JSON, so the unscoped path (auth off, or a cluster-wide caller) returns
its input untouched and costs nothing. Anything from a namespace that was not reviewed, or from no
namespace at all (a cluster-level finding), is left out of a namespaced caller's view: fail closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

Json = dict[str, Any]
K = TypeVar("K", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True)
class Scope:
    """What one caller may see: everything (`cluster`) or these namespaces' pods and owners."""

    cluster: bool
    namespaces: frozenset[str] = frozenset()

    def sees(self, namespace: str) -> bool:
        return self.cluster or (bool(namespace) and namespace in self.namespaces)


EVERYTHING = Scope(cluster=True)
NOTHING = Scope(cluster=False)


def decide(cluster_allowed: bool, namespace_allowed: Mapping[str, bool]) -> Scope:
    """The decision table: a cluster-wide allow wins; else exactly the namespaces allowed."""
    if cluster_allowed:
        return EVERYTHING
    return Scope(False, frozenset(ns for ns, ok in namespace_allowed.items() if ok and ns))


def row_keys(keys: Sequence[K], scope: Scope) -> Sequence[K]:
    """Row keys whose first element is the namespace (services.api.view.RowKey), filtered."""
    if scope.cluster:
        return keys
    return [k for k in keys if k[0] in scope.namespaces]


def _owner_id(o: Json) -> tuple[Any, ...]:
    return (o.get("pod_uid"), o.get("container"), o.get("device_id"))


def split_owners(owners: Iterable[Json], scope: Scope) -> tuple[list[Json], list[Json]]:
    """(visible, hidden) owners."""
    seen: list[Json] = []
    hidden: list[Json] = []
    for o in owners:
        (seen if scope.sees(str(o.get("namespace") or "")) else hidden).append(o)
    return seen, hidden


def gpu_row(row: Json, scope: Scope) -> Json:
    """A /v1/gpus row without other namespaces' owners, on the GPU and on its MIG instances;
    `hidden_owners` counts the distinct owners left out. Monitors (admin-access pods, usually in the
    operator's namespace) of other namespaces are left out without a count: they hold nothing."""
    if scope.cluster:
        return row
    hidden: set[tuple[Any, ...]] = set()
    owners, gone = split_owners(row.get("owners") or (), scope)
    monitors, unseen = split_owners(row.get("monitors") or (), scope)
    hidden.update(_owner_id(o) for o in gone)
    migs = []
    changed = bool(unseen)
    for m in row.get("mig_devices") or ():
        m_owners, m_gone = split_owners(m.get("owners") or (), scope)
        m_monitors, m_unseen = split_owners(m.get("monitors") or (), scope)
        hidden.update(_owner_id(o) for o in m_gone)
        changed = changed or bool(m_gone or m_unseen)
        migs.append({**m, "owners": m_owners, "monitors": m_monitors} if m_gone or m_unseen else m)
    if not hidden and not changed:
        return row
    return {**row, "owners": owners, "monitors": monitors, "mig_devices": migs, "hidden_owners": len(hidden)}


def xid_row(row: Json, scope: Scope) -> Json:
    """An /v1/xid row without other namespaces' owners (the error itself stays: it hit the node's GPU)."""
    if scope.cluster:
        return row
    owners, gone = split_owners(row.get("owners") or (), scope)
    if not gone:
        return row
    return {**row, "owners": owners, "hidden_owners": len({_owner_id(o) for o in gone})}


def finding(row: Json, scope: Scope) -> Json | None:
    """A /v1/findings row, or None when it belongs to a namespace the caller may not see (or to none)."""
    if scope.cluster:
        return row
    if not scope.sees(str(row.get("namespace") or "")):
        return None
    return xid_row(row, scope)


def owner_items(items: Sequence[Json], scope: Scope) -> tuple[list[Json], int]:
    """/v1/owners items the caller may see, and how many were left out."""
    if scope.cluster:
        return list(items), 0
    seen, gone = split_owners(items, scope)
    return seen, len(gone)
