"""The simulated cluster `periscope up` runs the services against, and `periscope up` itself.

- `up/`: the orchestration: the embedded broker (`broker`), the services it starts (`services`), the
  `Stack` that starts, supervises and stops them all, and the sampler of a `--truth` run.
- `cluster/`: the simulated cluster, from the scenario to every node's files and sockets.
- `apiserver/`, `kubelet`, `nvml/`, `procfs`: fakes of the real interfaces the services read.
- `scenario/`: the scenario file format; `report/`: `periscope report`; `cli`: both commands.
"""
