"""The real-apiserver tier: Kubernetes' own kube-apiserver (with etcd) built from source, one control
plane for the whole session.

The build happens once, right after collection (outside every test's timeout), into the cache
(periscope.sim.controlplane.build); a later session reuses it. Under pytest-xdist every worker asks for
it: one builds, the others wait on the build's lock, and each worker that runs tests here starts its own
control plane. Without a Go toolchain every test here skips with that one reason; a build that fails is
an error in each test, never a skip.

The session's control plane knows the users of the access-control tests, the ServiceAccount
identities of the watcher and the API (static tokens with the ServiceAccounts' usernames and groups)
and has deploy/base's RBAC and the users' bindings applied. DaemonSets are served without the watch
cache (`--watch-cache-sizes=daemonsets.apps#0`): their watches go to etcd, so a forced compaction
expires old versions there at once, as the issue's 410 cases need.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from periscope.sim.controlplane.build import ControlPlaneUnavailable, GoMissing, ensure_built
from periscope.sim.controlplane.cluster import (
    API_SA,
    NAMESPACE,
    WATCHER_SA,
    apply_all,
    deploy_rbac,
    scenario_tokens,
    user_bindings,
)
from periscope.sim.controlplane.process import ControlPlane, TokenUser, service_account_user
from periscope.sim.scenario import UserSpec

HERE = Path(__file__).parent
USERS = (
    UserSpec(name="alice", token="alice-token", namespaces=("infer", "team-d")),
    UserSpec(name="carol", token="carol-token", namespaces=("ml",)),
    UserSpec(name="ops", token="ops-token", cluster=True),
)
UNCACHED = "--watch-cache-sizes=daemonsets.apps#0"
_outcome: dict[str, str] = {}  # the collection-time build: binary | skip | error


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(HERE in Path(str(item.path)).parents for item in items) or _outcome:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    worker = hasattr(config, "workerinput")  # a pytest-xdist worker: its reporter's lines are not shown

    def say(line: str) -> None:
        if worker:  # its stderr is the terminal's; one worker builds and says so, the rest wait
            print(f"controlplane: {line}", file=sys.stderr, flush=True)
        elif reporter is not None:
            reporter.write_line(f"controlplane: {line}")

    try:
        _outcome["binary"] = str(ensure_built(say=say))
    except GoMissing as e:
        _outcome["skip"] = f"real-apiserver tier: {e}"
    except ControlPlaneUnavailable as e:
        _outcome["error"] = str(e)


def needs_controlplane() -> None:
    """Skip (no Go) or fail (the build failed) the calling test, as the collection-time build went."""
    if "skip" in _outcome:
        pytest.skip(_outcome["skip"])
    if "error" in _outcome:
        pytest.fail(f"the test control plane could not be built: {_outcome['error']}")


class Identities:
    watcher: TokenUser = service_account_user(NAMESPACE, WATCHER_SA)
    api: TokenUser = service_account_user(NAMESPACE, API_SA)


@pytest.fixture(scope="session")
def identities() -> Identities:
    return Identities()


@pytest.fixture(scope="session")
def kube(identities: Identities) -> Iterator[ControlPlane]:
    """The session's control plane, with deploy/base's RBAC and the USERS' bindings applied."""
    needs_controlplane()
    users = [identities.watcher, identities.api, *scenario_tokens(USERS)]
    plane = ControlPlane(users=users, extra_args=[UNCACHED]).start()
    try:
        apply_all(plane, [*deploy_rbac(), *user_bindings(USERS)])
        yield plane
    finally:
        plane.stop()
