"""Is everyone alive and moving: what this process is doing (activity), the job's board in the store
(board, records, seal), what a stopping rank leaves (failures), the watchdog and its checks, stall
reports, the flight recorder, and one answer to "is this process alive" (procs).

Nothing here imports torch: the launcher's worker entry uses it before the user's script does.
"""
