"""The placing loop: `cycle` runs passes, `place` decides one Workload (through
`placement.decide`) and applies the decision, `writes` holds the write order (ledger,
reservation, check), `record` what a pass decides on."""
