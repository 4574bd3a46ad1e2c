"""The training loop's parts: step state, the gated optimizer and accumulation windows, loaders,
precision, progress, seeding, and the Ring's collectives."""
