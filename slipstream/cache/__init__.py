"""Node-local cache of warehouse files: warmup (`warm`), index and lock (`index`), cached reads
(`reader`), Kubernetes placement (`placement`). See docs/cache.md."""
