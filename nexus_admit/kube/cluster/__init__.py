"""Nodes, pods, ResourceReservations, NodeResourceTopologies and DRA ResourceSlices →
a `ClusterSnapshot` with real free capacity.

Free capacity = allocatable − effective requests of bound, non-terminated pods − slots of live
ResourceReservations of other workloads whose pods are not bound yet − pods a Kueue TAS
topology assignment puts on a node and not bound there yet (`tas`). Over-commitment (e.g.
a pod bound before a reservation was noticed) clamps free capacity at zero.

GPUs
  * Devices on a node: allocatable `nvidia.com/gpu` (divided by the GFD label
    `nvidia.com/gpu.replicas` when time-slicing/MPS replicas are advertised); without the
    extended resource, the GPU devices of DRA ResourceSlices of driver `gpu.nvidia.com`.
  * Model / VRAM: GFD labels `nvidia.com/gpu.product`, `nvidia.com/gpu.memory` (MiB);
    otherwise the DRA device attribute `productName` and capacity `memory`.
  * Shared GPUs: a pod that requests `nvidia.com/gpu: 1` with the annotation
    `scheduling.kubenexus.io/gpu-fraction` ("0.25" or "250m") takes that share of one device.
    On a node advertising `nvidia.com/gpu.replicas: R`, a pod without the annotation takes
    units × 1/R of one device. Every other unit is a whole device.
  * Which device: the pod's reservation slot (pod label `scheduling.kubenexus.io/reservation`
    + annotation `scheduling.kubenexus.io/slot: <podSet>/<index>`) names the device indices;
    pods whose devices are unknown take them after all known claims, lowest free whole devices
    first, a share from the fullest device that still has room (the way fit_pod places them).

NUMA zones, in order of preference
  1. NodeResourceTopology (`topology.node.k8s.io/v1alpha2`, named after the node): zones of
     type `Node`, ordered by the number in their name (`node-0`, `node-1`); per zone the
     allocatable `cpu` and the `nvidia.com/gpu` count. GPU devices are given to zones in order
     (zone 0 gets the first k0 devices...); without GPU counts in the zones they are split
     evenly. A zone's free CPU is min(NRT `available`, allocatable − pods/slots known to sit in
     that zone).
  2. DRA: a GPU device attribute `numaNode` (int) gives that device's zone; CPU is split evenly.
     (`resource.kubernetes.io/pcieRoot` is read but is not a NUMA id, so it is not used to
     build zones: partial support.)
  3. Node label `scheduling.kubenexus.io/numa-zones: "<n>"`: n zones, devices and CPU split
     evenly by index order.
  4. None: the node has no NUMA zones (the engine treats every pod as aligned).
A pod sits in the zone of its annotation `scheduling.kubenexus.io/numa-zone`, else of its slot,
else of its first GPU; otherwise its CPU is taken from the node only.

Malformed objects (`skipped` given: the controller's passes)
  One object that cannot be read is left out and listed in `skipped`; everyone else is
  placed. Never freer than the truth: a bound pod whose `gpu-fraction` cannot be read takes
  its `nvidia.com/gpu` units as whole devices, one whose `numa-zone` cannot be read takes its
  CPU from every zone of its node, a reservation whose expiry cannot be read is live; a pod
  or a reservation whose use of capacity cannot be read at all takes its node(s) out of
  placement. A malformed Node (or its NodeResourceTopology or ResourceSlice) is left out.
  A TAS topology assignment that cannot be read names no node: it is not counted (listed;
  the apiserver's validation of the Workload CRD makes this rare).
  Without `skipped` (`nexus-admit plan`) the first one raises `TranslationError`.

The package, one module per step:
  `nodes`     Node (+ NRT, ResourceSlices) → model Node at allocatable; Kueue Topologies
  `capacity`  what one bound pod or one reserved slot takes (`Claim`), and applying it
  `snapshot`  `build_snapshot`: nodes, then pods, then reservations, then free capacity,
              each object skipped on its own
  `tas`       what a Kueue TAS topology assignment holds
  `skipping`  how a skipped object is listed
"""

from __future__ import annotations

from nexus_admit.kube.cluster.capacity import gpu_fraction_milli, pod_is_active
from nexus_admit.kube.cluster.nodes import node_from_object, topologies_from_objects
from nexus_admit.kube.cluster.snapshot import build_snapshot

__all__ = [
    "build_snapshot",
    "gpu_fraction_milli",
    "node_from_object",
    "pod_is_active",
    "topologies_from_objects",
]
