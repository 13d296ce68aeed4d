"""`make bench-e2e`: Kueue alone against Kueue + nexus-admit on a large KWOK GPU fleet.

Pure parts (no cluster): `workloads` (the generated Workloads and their Jobs), `queues`
(ClusterQueues sized to the fleet), `stats` (percentiles, Prometheus histograms, throughput),
`booking` (double-booked GPUs, pods on their planned node). The cluster-facing parts:
`recorder` (watches and /proc samples) and `run` (the driver, `python e2e/bench_e2e/run.py`).
"""
