"""Preemption, drains and their progress, as the controller applies them: `victims` reads
running gangs and drives evictions through Kueue; `apply` writes what a `Preempt`, `Drain`,
`PlaceOverDrains` or `MoveOffDrain` decision (placement/decide.py) means in the cluster."""
