"""The simulated cluster: its GPUs (`hardware`) and pods as a pure function of the scenario (`model`), each
node's kubelet, NVML and /proc (`node`), the apiserver's objects (`kube_objects`), the ground truth
(`truth`), and the process that drives them along the scenario's clock (`simulator`)."""
