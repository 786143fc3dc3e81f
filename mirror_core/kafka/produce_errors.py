"""How the raw-batch producer reads Kafka's answers: which errors refuse a batch for good, which mean a newer writer
(or the coordinator's timeout abort) fenced us, which mean the broker lost our producer state, which mean the
transaction coordinator moved, and which mean the cluster will not let us be a transactional producer.

Used by the writer (:mod:`mirror_core.kafka.writer`), its pipeline (:mod:`mirror_core.kafka.produce_pipeline`) and
its transactions (:mod:`mirror_core.kafka.producer_transactions`); an answer in none of these sets is retried when
kafka-python calls it retriable and refuses the batch otherwise.
"""

from __future__ import annotations

import kafka.errors as Errors

# The target refuses these for good: resending the same bytes cannot help.
REJECTIONS = (
    Errors.MessageSizeTooLargeError, Errors.CorruptRecordError, Errors.InvalidRecordError,
    Errors.InvalidTimestampError, Errors.TopicAuthorizationFailedError, Errors.RecordListTooLargeError,
    Errors.InvalidTopicError, Errors.UnsupportedForMessageFormatError, Errors.InvalidRequiredAcksError,
    Errors.ClusterAuthorizationFailedError, Errors.TransactionalIdAuthorizationFailedError,
    Errors.UnsupportedCompressionTypeError, Errors.PolicyViolationError,
)
# a transaction coordinator's "not me (any more)": the cached coordinator is forgotten and looked up again
COORDINATOR_MOVED = frozenset({Errors.NotCoordinatorError, Errors.CoordinatorNotAvailableError})
FENCED = (Errors.InvalidProducerEpochError, Errors.ProducerFencedError, Errors.TransactionCoordinatorFencedError,
          Errors.InvalidProducerIdMappingError, Errors.InvalidTxnStateError)
STATE_LOST = (Errors.OutOfOrderSequenceNumberError, Errors.UnknownProducerIdError)
# InitProducerId answers meaning "this cluster will not let us be a transactional producer" (not: "try again").
NO_TRANSACTIONS = (Errors.TransactionalIdAuthorizationFailedError, Errors.UnsupportedVersionError,
                   Errors.ClusterAuthorizationFailedError)


def error_name(error: type) -> str:
    """Kafka's name of an error (``NOT_LEADER_OR_FOLLOWER``), else the class name."""
    return getattr(error, "message", None) or error.__name__
