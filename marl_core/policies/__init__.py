"""Population members: the `Policy` interface, its tabular and neural kinds, populations by role,
and weights-only storage."""
