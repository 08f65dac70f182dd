"""txmq for asyncio: the same producers, transactions, checks and consumers as ``txmq``, as
coroutines on one event loop::

    import txmq
    from txmq.aio import AsyncTransactionListener, AsyncTransactionProducer

    class Listener(AsyncTransactionListener):
        async def execute_local_transaction(self, message, arg):
            async with db.transaction():          # your asyncio database driver
                await db.execute("INSERT ...", message.transaction_id)
            return txmq.LocalTransactionState.COMMIT

        async def check_local_transaction(self, message):
            found = await db.fetchval("SELECT 1 FROM orders WHERE txn = $1", message.transaction_id)
            return txmq.LocalTransactionState.COMMIT if found else txmq.LocalTransactionState.ROLLBACK

    async with AsyncTransactionProducer("127.0.0.1:9876", producer_group="orders",
                                        listener=Listener()) as producer:
        results = await asyncio.gather(*(producer.send_in_transaction(txmq.Message("orders", body))
                                         for body in bodies))

The asyncio twin of every sync client: :class:`AsyncProducer`, :class:`AsyncTransactionProducer`
(``listener=``, ``checker=``, ``decisions=``; ``async with producer.begin_transaction() as tx``
and ``async with producer.transaction(conn)``), :class:`AsyncSimpleConsumer` (``async for``),
:class:`AsyncPushConsumer` and :class:`AsyncAdmin`, with the sync clients' options
(tests/unit/test_aio_parity.py lists the few differences and why). Both flavours drive the
same cores (docs/sdk-internals.md): routing, retries, checks and their flow control,
receive passes, acks and tracing are decided once.

Every coroutine of the process shares one connection and one Produce stream per broker, so
many concurrent transactions travel in few stream messages. Errors, ids, routing and check
answering are those of the sync SDK (``txmq``); values (``txmq.Message``, results,
``txmq.InProgress``) are shared with it. A client belongs to the event loop it was first
used on.
"""

from ._admin import AsyncAdmin
from ._consumer import AsyncSimpleConsumer
from ._producer import AsyncProducer, AsyncTransaction, AsyncTransactionListener, AsyncTransactionProducer
from ._push import AsyncPushConsumer

__all__ = ["AsyncAdmin", "AsyncProducer", "AsyncPushConsumer", "AsyncSimpleConsumer", "AsyncTransaction",
           "AsyncTransactionListener", "AsyncTransactionProducer"]
