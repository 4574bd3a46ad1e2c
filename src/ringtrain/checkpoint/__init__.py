"""Checkpoints: atomic files and RNG capture (files), the user's state in any layout (state),
sharded DCP folders (sharded), a run's checkpoint folder (folder), its lock, its configuration
fingerprint, what existing checkpoints mean for a new run (policy), and resuming (resume)."""
