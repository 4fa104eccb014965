"""Slipstream's domain errors. Each message names the thing that is wrong and what to do."""


class SlipstreamError(Exception):
    """Base of every error Slipstream raises on purpose."""


class ConfigError(SlipstreamError, ValueError):
    """A setting, parameter or config file value is invalid."""


class StackError(SlipstreamError):
    """The local stack could not start, stop or be reached."""


class RawDataError(SlipstreamError):
    """The raw zone is missing a day, a file is unreadable or a required column is missing."""


class DuplicateSampleIds(RawDataError):
    """A day's sample ids already exist in other days of the table; the message names the days,
    how many ids each holds, and examples. Nothing was committed."""


class RejectRateExceeded(SlipstreamError):
    """Too many raw records were rejected; the message names the worst files."""


class QualityGateFailed(SlipstreamError):
    """A critical data-quality expectation failed; the message lists each one with its value."""

    result: object | None = None
    """The gate's `slipstream.quality.gate_result.GateResult`, when the gate raised it."""


class HandoffError(SlipstreamError):
    """The batch→stream handoff offsets could not be determined or verified."""


class StreamDataLost(SlipstreamError):
    """The broker no longer holds records a run has already read past (its high watermark fell below
    the run's position): new records would reuse those offsets and be skipped. The message names
    the topic, partition and offsets."""


class StreamReadError(SlipstreamError):
    """Committed records of a Kafka partition could not be read (or verified absent) within the
    time allowed; the message names the topic, partition and offsets."""


class RunFolderWriteError(SlipstreamError):
    """A file of a run could not be written (a full, read-only or unwritable disk); the message
    names the file and says what to do."""


class PeerFailed(SlipstreamError):
    """A rank of a distributed run stopped because another rank failed first; the message names
    that rank and its error."""


class ResumeError(SlipstreamError):
    """A checkpoint cannot be resumed as asked (e.g. a different world size in the batch phase)."""


class CommitConflict(SlipstreamError):
    """A day's commit kept losing to concurrent writers of the same table; the message says which
    day and how often it retried."""


class PreprocessError(SlipstreamError):
    """The Spark preprocessing job failed for a reason that is not a data problem (Spark/Java
    did not start, an engine error, a timeout); the message carries the tail of the job's log."""

class CacheError(SlipstreamError):
    """The node-local cache cannot be used as asked (bad layout, a path outside the cache...)."""


class CacheBusy(CacheError):
    """Another warmup holds the cache's lock longer than the wait allowed; the message names its PID."""


class CacheWarmError(CacheError):
    """Some files of the window could not be copied; the message names them. Re-running resumes:
    files already placed stay cached, nothing partial is ever visible."""


class NativeBuildError(SlipstreamError):
    """The optional native kernels could not be built or loaded; callers fall back to Arrow and numpy."""


class PlanError(ConfigError):
    """A run's plan.json is missing, malformed, from another version, or does not match the data
    it describes; the message names the file and the key."""


class MetricsContractError(SlipstreamError):
    """A run's metrics.json does not fit its contract (`slipstream.pipeline.run_metrics`): a key of
    the wrong type, or one the contract does not declare."""


class DatasetMismatch(ConfigError):
    """A data set's spec does not match the table, raw zone or folder it was pointed at (another
    data set's); the message says which spec, which table or folder, and which setting to change."""
