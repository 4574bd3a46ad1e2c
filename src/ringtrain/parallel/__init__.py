"""Who am I and on what: the launcher environments, devices and backends, the device mesh, the
process-group service, cutting a model into stages, SyncBatchNorm."""
