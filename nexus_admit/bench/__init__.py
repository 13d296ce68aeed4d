"""`nexus-admit bench`: synthetic heterogeneous fleets and gangs, every policy side by side."""
