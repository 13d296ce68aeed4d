"""Ungating: gated pods of a reservation take their slots (`ungater`), rank by rank
(`slot_assignment`)."""
