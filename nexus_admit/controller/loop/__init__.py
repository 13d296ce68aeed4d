"""The placing loop: `cycle` runs passes, `place` decides one Workload (through
`placement.decide`) and applies the decision, `record` is what a pass decides on. The
write order (ledger, reservation, check) is `controller/writes.py`, shared with
`controller/preemption/`."""
