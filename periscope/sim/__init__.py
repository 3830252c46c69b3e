"""The simulated cluster `periscope up` runs the services against, and `periscope up` itself.

- `up/`: the orchestration: the `Stack` that starts, supervises and stops the three parts (the embedded
  broker, from `periscope.bus`, behind mutual TLS with `--secure`; the simulated cluster's process; the
  services of `services`), its child processes (`child`) and the sampler of a `--truth` run.
- `cluster/`: the simulated cluster, from the scenario to every node's files and sockets.
- `apiserver/`, `kubelet`, `nvml/`, `procfs`: fakes of the real interfaces the services read.
- `scenario/`: the scenario file format; `report/`: `periscope report`; `cli`: both commands.
"""
