"""Process primitives: pidfds, the guard (shepherd), cgroups, private files, signals, helper environments."""
