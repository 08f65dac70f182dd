"""txmq: transactional messages in the style of Apache RocketMQ, over gRPC.

Clients configure one thing, the name server address list::

    import txmq

    class Listener(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            ...  # change the database, recording message.transaction_id
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message):
            ...  # look the transaction up by message.transaction_id: COMMIT, ROLLBACK,
            ...  # UNKNOWN, or txmq.InProgress(retry_after_seconds=5) while it still runs

    with txmq.TransactionProducer("127.0.0.1:9876", producer_group="orders",
                                  listener=Listener()) as producer:
        result = producer.send_in_transaction(txmq.Message("orders", b"..."))

The producer answers the checkers' questions about undecided transactions (its own, or
those of a crashed instance of the group) for as long as it is open.

Every error is a :class:`TxmqError`; ``err.retryable`` says whether repeating may succeed.
The generated stubs live in ``txmq.v1``.
"""

from ._admin import Admin
from ._checking import CheckMessage, InProgress
from ._consumer import PushConsumer, SimpleConsumer
from ._errors import (AlreadyExistsError, BrokerNotFoundError, CancelledError, ClientClosedError,
                      ConnectionLimitError, ConsumerGroupNotFoundError, ConsumersLiveError, DeadlineExceededError, DiskFullError,
                      GroupNotEmptyError, ProducerGroupNotFoundError, ProducersLiveError, TransactionsOpenError,
                      FailedPreconditionError, InternalError, NotANameServerError,
                      InvalidArgumentError, InvalidFieldError, InvalidIdError, InvalidNameError,
                      LeadershipLostError, MessageTooLargeError, NoBrokerError, NoLeaderError, NotEnoughReplicasError,
                      NotFoundError, NotLeaderError, OverloadedError, PermissionDeniedError, PrincipalLimitError,
                      PropertiesTooLargeError,
                      ShardDrainingError,
                      QueueNotFoundError, QuotaExceededError, ReceiptHandleNotFoundError, ResourceExhaustedError,
                      StaleClaimError, SystemTopicError, TopicExistsError, TopicInUseError, TopicNotFoundError,
                      TopicTypeMismatchError,
                      TransactionNotFoundError, TransactionStateError, TxmqError, UnauthenticatedError,
                      UnavailableError, UndecodableRequestError, WrongBrokerError)
from ._faults import RoutingStats, ShardStats
from ._global import GlobalTransactionResult
from ._producer import Producer, Transaction, TransactionListener, TransactionProducer
from ._tls import TLS
from ._types import (ConsumeResult, LocalTransactionState, Message, ReceivedMessage, SendReceipt, SqlFilter,
                     TransactionMessage, TransactionResult, TransactionState)

__all__ = [
    # clients
    "Admin",
    "Producer",
    "PushConsumer",
    "SimpleConsumer",
    "Transaction",
    "TransactionListener",
    "TransactionProducer",
    # values
    "CheckMessage",
    "ConsumeResult",
    "GlobalTransactionResult",
    "InProgress",
    "LocalTransactionState",
    "Message",
    "ReceivedMessage",
    "RoutingStats",
    "SendReceipt",
    "ShardStats",
    "SqlFilter",
    "TransactionMessage",
    "TransactionResult",
    "TransactionState",
    # settings
    "TLS",
    # errors
    "AlreadyExistsError",
    "BrokerNotFoundError",
    "CancelledError",
    "ClientClosedError",
    "ConnectionLimitError",
    "ConsumerGroupNotFoundError",
    "ConsumersLiveError",
    "GroupNotEmptyError",
    "ProducerGroupNotFoundError",
    "ProducersLiveError",
    "TransactionsOpenError",
    "DeadlineExceededError",
    "DiskFullError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidFieldError",
    "InvalidIdError",
    "InvalidNameError",
    "LeadershipLostError",
    "MessageTooLargeError",
    "NoBrokerError",
    "NoLeaderError",
    "NotANameServerError",
    "NotEnoughReplicasError",
    "NotFoundError",
    "NotLeaderError",
    "OverloadedError",
    "PermissionDeniedError",
    "PrincipalLimitError",
    "PropertiesTooLargeError",
    "QueueNotFoundError",
    "QuotaExceededError",
    "ReceiptHandleNotFoundError",
    "ResourceExhaustedError",
    "ShardDrainingError",
    "StaleClaimError",
    "SystemTopicError",
    "TopicExistsError",
    "TopicInUseError",
    "TopicNotFoundError",
    "TopicTypeMismatchError",
    "TransactionNotFoundError",
    "TransactionStateError",
    "TxmqError",
    "UnauthenticatedError",
    "UnavailableError",
    "UndecodableRequestError",
    "WrongBrokerError",
]
